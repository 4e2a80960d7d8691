"""The compiled core (ADR 0018): the framer's feed() in C, built from source with the system compiler.

Everything else about the package is in pyproject.toml. The extension is optional: where it cannot be built (no
compiler, no Python headers) the install goes on and the seat uses the pure-Python framer, and says so
(proxy.wire.framer.IMPLEMENTATION_NOTE, the "listening" log line); tests/unit/test_framer.py then fails its
compiled variant rather than skip it.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("proxy.wire._cframer", ["proxy/wire/_cframer.c"], optional=True,
                             extra_compile_args=["-O2"])])
