"""Scripts for a key held by one owner (its value is the owner's token): renew it or delete it only while the
owner still holds it. The scheduler's leadership and ``loopsq migrate``'s lock are such keys."""

from __future__ import annotations

#: ``PEXPIRE KEYS[1] ARGV[2]`` while its value is ``ARGV[1]``; 1 when renewed, else 0.
EXTEND = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""
#: ``DEL KEYS[1]`` while its value is ``ARGV[1]``; 1 when deleted, else 0.
RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
