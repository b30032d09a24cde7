"""A stand-in for pycuda on machines without a GPU: see driver.py. Only tests put this package on sys.path."""

VERSION = (0, 0, 0)
