"""The compiled core (ADR 0018): the framer's feed() and the quiet read path's Bind/Describe/Execute/Sync
bookkeeping in C, built from source with the system compiler.

Everything else about the package is in pyproject.toml. The extensions are optional: where they cannot be built (no
compiler, no Python headers) the install goes on and the seat uses the pure-Python framer, and says so
(proxy.wire.framer.IMPLEMENTATION_NOTE, the "listening" log line); tests/unit/test_framer.py then fails its
compiled variant rather than skip it.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("proxy.wire._cframer", ["proxy/wire/_cframer.c"], optional=True,
                             extra_compile_args=["-O2"]),
                   Extension("proxy.readpath._cquiet", ["proxy/readpath/_cquiet.c"], optional=True,
                             extra_compile_args=["-O2"])])
