"""The coordinator: every etcd call of Highwater lives in this package.

- keys.py: the etcd key layout (DESIGN.md section 2).
- store.py: the MetadataStore protocol, its data types and errors, and EtcdStore.
- memory_store.py: MemoryStore, the same protocol in memory for the simulation.
- lease.py, registration.py, election.py: leases kept alive, broker/gateway
  registration (broker epoch), controller election and fencing (controller epoch).
- etcd_server.py: a local etcd server as a child process.
- limits.py: every bound of the package, with its unit.
"""
