"""Adapters to other libraries' codec interfaces: :mod:`gcodec.interop.numcodecs` (numcodecs, zarr
format 2 filters) and :mod:`gcodec.interop.zarr` (a zarr v3 serializer). Each needs its library
installed (``pip install gcodec[zarr]``); importing ``gcodec`` imports neither.
"""
