"""Operator tools: the `highwater` command line, ACL and token commands, cluster status, the
demo and the local cluster launcher. Unlike the client library they may start services
(the launcher runs etcd and the service processes as children)."""
