"""The Lua scripts of fleet-wide pools (``state.pools``): acquire, renew and release a slot, each one atomic step on
Redis's clock.

A holder entry is ``<lease key>|<token>|<fence>|<since ms>``, parsed from the right (a lease key may hold ``|``). A
holder is live while its lease key holds its token; a waiter is still asking while its last ask (``seen``) is at
most the waiter TTL old. Numbers are written with ``%.0f``/``%.17g``: Lua's own ``tostring`` would round them.
"""

from __future__ import annotations

_LIB = """
local function clock()
  local t = redis.call('TIME')
  local s, us = tonumber(t[1]), tonumber(t[2])
  return s * 1000 + math.floor(us / 1000), s * 1000000 + us
end

local function pool_limit(pools, name)
  local def = redis.call('HGET', pools, name)
  if not def then return nil end
  return tonumber(string.match(def, '"limit":%s*(%d+)'))
end

-- Count the live holders (lease key still holding the token), dropping the dead; and `who`'s live entry.
local function live_holders(holders, who)
  local live, mine = 0, nil
  local all = redis.call('HGETALL', holders)
  for i = 1, #all, 2 do
    local lease, token, fence = string.match(all[i + 1], '^(.*)|([^|]*)|(%d+)|%d+$')
    if lease and redis.call('GET', lease) == token then
      live = live + 1
      if all[i] == who then mine = {token, fence} end
    else
      redis.call('HDEL', holders, all[i])
    end
  end
  return live, mine
end

-- The waiters still asking among the first `n` of the queue (up to `want` of them), in order; those that stopped
-- asking are dropped on the way. In batches: Lua's unpack takes a few thousand values at most.
local function fresh_head(waiters, seen, n, want, now_ms, ttl)
  local fresh = {}
  local kept, looked = 0, 0
  while looked < n and #fresh < want do
    local batch = redis.call('ZRANGE', waiters, kept, kept + math.min(200, n - looked) - 1)
    if #batch == 0 then break end
    local asked = redis.call('HMGET', seen, unpack(batch))
    for i, w in ipairs(batch) do
      looked = looked + 1
      local at = tonumber(asked[i])
      if at and now_ms - at <= ttl then
        kept = kept + 1
        fresh[#fresh + 1] = w
        if #fresh >= want then return fresh end
      else
        redis.call('ZREM', waiters, w)
        redis.call('HDEL', seen, w)
      end
    end
  end
  return fresh
end
"""

# KEYS: pools, holders, waiters, seen, fence, lease. ARGV: pool, holder, lease ms, token, waiter ttl ms, max walk.
# Reply: {0} no such pool; {1, token, fence} holding; {2, position, live holders, limit} waiting.
ACQUIRE = _LIB + """
local limit = pool_limit(KEYS[1], ARGV[1])
if not limit then return {0} end
local holder, ttl = ARGV[2], tonumber(ARGV[5])
local now_ms, now_us = clock()
local live, mine = live_holders(KEYS[2], holder)
if mine then return {1, mine[1], mine[2]} end
-- record the ask; a waiter that had stopped asking joins again at the back
local asked = tonumber(redis.call('HGET', KEYS[4], holder))
local rank = redis.call('ZRANK', KEYS[3], holder)
if rank and not (asked and now_ms - asked <= ttl) then
  redis.call('ZREM', KEYS[3], holder)
  rank = false
end
if not rank then
  local last = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')
  local score = now_ms
  if last[2] and tonumber(last[2]) >= score then score = tonumber(last[2]) + 1 / 1024 end
  redis.call('ZADD', KEYS[3], string.format('%.17g', score), holder)
  rank = redis.call('ZCARD', KEYS[3]) - 1
end
redis.call('HSET', KEYS[4], holder, string.format('%.0f', now_ms))
redis.call('PEXPIRE', KEYS[3], ttl)
redis.call('PEXPIRE', KEYS[4], ttl)
-- who is still asking ahead of us
local walk = math.min(rank, tonumber(ARGV[6]))
local ahead = #fresh_head(KEYS[3], KEYS[4], walk, walk, now_ms, ttl)
if rank <= walk and ahead < limit - live then
  if redis.call('EXISTS', KEYS[5]) == 0 then redis.call('SET', KEYS[5], string.format('%.0f', now_us)) end
  local fence = string.format('%.0f', redis.call('INCR', KEYS[5]))
  local lease_ms = tonumber(ARGV[3])
  redis.call('SET', KEYS[6], ARGV[4], 'PX', lease_ms)
  redis.call('HSET', KEYS[2], holder, KEYS[6] .. '|' .. ARGV[4] .. '|' .. fence .. '|' .. string.format('%.0f', now_ms))
  if redis.call('PTTL', KEYS[2]) < lease_ms then redis.call('PEXPIRE', KEYS[2], lease_ms) end
  redis.call('ZREM', KEYS[3], holder)
  redis.call('HDEL', KEYS[4], holder)
  return {1, ARGV[4], fence}
end
return {2, ahead + rank - walk, live, limit}
"""

# KEYS: holders. ARGV: holder, token, lease ms. Reply: 1 extended, 0 not ours (lost, released or pool deleted).
RENEW = """
local entry = redis.call('HGET', KEYS[1], ARGV[1])
if not entry then return 0 end
local lease, token = string.match(entry, '^(.*)|([^|]*)|%d+|%d+$')
if not lease or token ~= ARGV[2] or redis.call('GET', lease) ~= token then return 0 end
local ms = tonumber(ARGV[3])
redis.call('PEXPIRE', lease, ms)
if redis.call('PTTL', KEYS[1]) < ms then redis.call('PEXPIRE', KEYS[1], ms) end
return 1
"""

# KEYS: pools, holders, waiters, seen. ARGV: pool, holder, token, waiter ttl ms, max walk.
# Reply: the head waiters that may go now (up to the free slots).
RELEASE = _LIB + """
local entry = redis.call('HGET', KEYS[2], ARGV[2])
if entry then
  local lease, token = string.match(entry, '^(.*)|([^|]*)|%d+|%d+$')
  if lease and token == ARGV[3] then
    if redis.call('GET', lease) == token then redis.call('DEL', lease) end
    redis.call('HDEL', KEYS[2], ARGV[2])
  end
end
local limit = pool_limit(KEYS[1], ARGV[1])
if not limit then return {} end
local now_ms = clock()
local free = limit - live_holders(KEYS[2], '')
return fresh_head(KEYS[3], KEYS[4], free + tonumber(ARGV[5]), free, now_ms, tonumber(ARGV[4]))
"""
