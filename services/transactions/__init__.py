"""Transactions and exactly-once (issue 41; KIP-98, KIP-447, KIP-890): the transaction
coordinator's pure rules (coordinator.py). Its durable format is state.py."""
