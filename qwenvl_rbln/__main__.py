from qwenvl_rbln.entry import main

if __name__ == "__main__":
    main()
