"""Fixtures every test module may use without importing them.

- `kube_api`, `kube_client` (support/fixtures.py): a started API emulator and a client of it;
- `kube` (kube_fixtures.py): the emulator plus a config and the Kubernetes adapter wired on it;
  `@pytest.mark.servers("emulator", "real")` runs a test on both, the real one being
- `control_plane` (support/real_cluster.py): etcd, kube-apiserver, controller-manager,
  scheduler and kwok, started once per session.
"""

pytest_plugins = ["support.fixtures", "support.real_cluster", "kube_fixtures"]
