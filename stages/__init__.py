"""One module per DVC stage; each has a ``main()`` that takes paths as arguments."""
