"""Builds the tern package, generating tern.v1 from the repository's protos first.

protoc and grpc_python_plugin come from Debian's protobuf-compiler-grpc (the C++ build needs
them too). The stubs are written into the build tree only, so the source tree stays clean.
"""

import os
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO_ROOT = os.path.normpath(os.path.join(HERE, "..", "..", "proto"))
PROTOS = ["tern/v1/tensor.proto", "tern/v1/secagg.proto", "tern/v1/worker.proto",
          "tern/v1/server.proto", "tern/v1/scheduler.proto", "tern/v1/records.proto"]


def _tool(name):
    path = shutil.which(name)
    if path is None:
        raise SystemExit("tern: %s not found; install protobuf-compiler-grpc "
                         "(apt-get install protobuf-compiler-grpc)" % name)
    return path


class BuildWithStubs(build_py):
    """build_py, then protoc + grpc_python_plugin into build_lib/tern/v1."""

    def run(self):
        super().run()
        if not os.path.isdir(PROTO_ROOT):
            raise SystemExit("tern: %s not found: build the package from the tern source tree "
                             "(clients/python inside it)" % PROTO_ROOT)
        out = os.path.join(self.build_lib, "tern", "v1")
        os.makedirs(out, exist_ok=True)
        open(os.path.join(out, "__init__.py"), "a").close()
        subprocess.check_call([
            _tool("protoc"), "--proto_path=" + PROTO_ROOT, "--python_out=" + self.build_lib,
            "--grpc_out=" + self.build_lib,
            "--plugin=protoc-gen-grpc=" + _tool("grpc_python_plugin")
        ] + [os.path.join(PROTO_ROOT, p) for p in PROTOS])


setup(cmdclass={"build_py": BuildWithStubs})
