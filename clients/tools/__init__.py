"""Operator tools that speak to a running cluster: the `highwater` client commands (topics,
produce, consume, groups, ACLs, tokens) and cluster status. They import only the client
library: the commands that start processes (`cluster up`, `tls init`, `highwater broker`...)
live in services/launcher/, which puts them together with these into the one `highwater`."""
