"""Kubernetes objects as data, the floor everything that writes or reads them stands on: `kinds` (each kind
orch sends or asks for, named once) and `read` (total readers of the JSON a server returns). No I/O; imports
nothing of orch's but `naming`.
"""
