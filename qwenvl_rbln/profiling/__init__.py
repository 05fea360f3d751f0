"""qvl profile: time every compiled graph, fit it over context, and write timings.json beside the roofline."""
