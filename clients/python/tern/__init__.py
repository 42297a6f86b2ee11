"""tern's Python package: drive a tern worker from your own PyTorch training loop
(`tern.optim.DistributedOptimizer`, `tern.trainer.TernTrainer`) or take part in an aggregator's
rounds with your own model (`tern.federated`). docs/python.md says how to install and use it.

The wire modules (`tern.v1`) are generated from proto/ when the package is built (setup.py) or
by the CMake build (build/clients/python), never copied by hand.
"""

import pkgutil

# In a source checkout tern.v1 lives in the build tree (build/clients/python/tern/v1): let this
# package span both folders when both are on sys.path. An installed package holds it itself.
__path__ = pkgutil.extend_path(__path__, __name__)

__version__ = "0.1.0"
