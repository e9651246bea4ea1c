"""Fixtures every test module may use without importing them.

- `kube_api`, `kube_client` (support/fixtures.py): a started API emulator and a client of it;
- `kube` (kube_fixtures.py): the emulator plus a config and the Kubernetes adapter wired on it.
"""

pytest_plugins = ["support.fixtures", "kube_fixtures"]
