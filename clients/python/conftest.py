"""pytest settings of the Python package's tests."""


def pytest_configure(config):
    config.addinivalue_line("markers", "worker_flags(*flags): the flags of the test's workers")
