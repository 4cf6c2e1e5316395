"""The composition root above the client library and the services: the `highwater` entry point
(cli.py: the client commands of clients/tools/ plus those that start processes), the local
cluster launcher (local_cluster.py: etcd and the services as child processes, `cluster up`),
its demo (demo.py) and the local certificate authority (tls_cli.py: `tls init`).

Nothing in clients/, services/ or coordinator/ imports this package
(tests/unit/test_pure_imports.py): only the entry point, the tests and the benchmarks do.
"""
