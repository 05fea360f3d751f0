"""Views: the one renderer (human or --json) and every rich view; only commands and the CLI use them."""
