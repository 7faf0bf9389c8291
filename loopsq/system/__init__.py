"""What this host gives loopsq: process identity and liveness (pid + start time, group kills, the host name) and
configuration (where Redis and the data directory are found).

May import ``loopsq.domain`` and ``loopsq.errors``; nothing in loopsq's other layers.
"""
