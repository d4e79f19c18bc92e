"""Wire-layout facts that codecs and every kernel backend share.

A codec's layout (which sections, how many bytes, which scale rule, how indices are blocked) is
part of its spec, not of one backend's kernels: the modules here hold those facts as plain Python
constants and dataclasses, so that the CPU kernels, a device backend and the codecs read the same
numbers. Nothing here compiles or allocates.
"""
