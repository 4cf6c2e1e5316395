"""The one part of clients/common that does I/O: how a process talks to a broker (unary calls
carried over streams) and which host it runs on. Shared by the client library and the servers,
as Kafka's broker shares the clients' network code; the rest of clients/common is pure, and no
pure module may reach this package (tests/unit/test_pure_imports.py).
"""
