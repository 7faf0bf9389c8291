"""Lua scripts that do RQ's and rq-scheduler's bookkeeping of a job in one round trip (a timer armed, moved,
taken, started, settled; a job deleted): each writes RQ's layout (``names``) exactly as RQ's own code would, and
its contract test (``tests/contract``) holds it to what the installed RQ leaves."""

from __future__ import annotations

from loopsq.engine.rqcompat import names

# Arm a loop's timer in one round trip. When the entry armed already is for the same millisecond and still
# scheduled, nothing is written but the loop's maintenance watch, which moves past the timer's time as a new arm
# would move it. Otherwise: the new job hash, its rq-scheduler entry, the swap of the loop's timer, and the drop of
# the entry it replaces if that is still scheduled, or if it was taken by a worker that is gone (``take_fire``; RQ
# never saw it, so nothing else would delete it). A scheduled entry rq-scheduler is moving right now (it enqueues
# the job before it removes the entry) keeps its job hash: a worker may be running it, and RQ deletes it when done
# (fire jobs keep no result).
#
# With an expected loop (ARGV[8] not empty) the timer is armed only while the loop's JSON is exactly that: the
# arm that follows a claim or a finalize in the same round trip (``arm_after``) then applies only when that
# transition's loop is the loop now, so it can never arm a loop that someone else has moved since.
#
# The job's queue (its ``origin``) is the loop's requirement set's (``domain.labels.queue_name``); a queue other
# than the base one is listed in loopsq's queue registry (``keys.queues``), where workers find what to listen on.
#
# KEYS: the loop's timer key, the scheduled set, the loop watch, the new job's hash, the loop, the queue registry.
# ARGV: job id prefix (loop and ms), watch score, loop id, new job id, score (s), job key prefix, worker key
#       prefix, expected loop JSON or '', the queue to list ('' for the base one) and its registry entry, then
#       the job hash's fields and values.
# Returns the armed job id, or 0 when the loop was not the one expected.
ARM = """
if ARGV[8] ~= '' and redis.call('GET', KEYS[5]) ~= ARGV[8] then return 0 end
local id = redis.call('GET', KEYS[1])
if id and string.sub(id, 1, #ARGV[1]) == ARGV[1] and redis.call('ZSCORE', KEYS[2], id) then
  redis.call('ZADD', KEYS[3], ARGV[2], ARGV[3])
  return id
end
if ARGV[9] ~= '' then redis.call('HSETNX', KEYS[6], ARGV[9], ARGV[10]) end
redis.call('HSET', KEYS[4], unpack(ARGV, 11))
redis.call('ZADD', KEYS[2], ARGV[5], ARGV[4])
redis.call('SET', KEYS[1], ARGV[4])
if id and id ~= ARGV[4] then
  if redis.call('ZREM', KEYS[2], id) == 1 then
    local status = redis.call('HGET', ARGV[6] .. id, 'status')
    if status ~= 'queued' and status ~= 'started' then redis.call('DEL', ARGV[6] .. id) end
  else
    local taken = redis.call('HMGET', ARGV[6] .. id, 'loopsq_taken', 'worker_name')
    if taken[1] and taken[2] and redis.call('EXISTS', ARGV[7] .. taken[2]) == 0 then
      redis.call('DEL', ARGV[6] .. id)
    end
  end
end
redis.call('ZADD', KEYS[3], ARGV[2], ARGV[3])
return ARGV[4]
"""

# Unschedule a timer entry; its job hash goes too unless rq-scheduler is moving it onto the queue right now.
DROP = """
if redis.call('ZREM', KEYS[1], ARGV[1]) == 1 then
  local status = redis.call('HGET', KEYS[2], 'status')
  if status ~= 'queued' and status ~= 'started' then redis.call('DEL', KEYS[2]) end
end
return 1
"""

# Move due timers onto their queues: what rq-scheduler's ``enqueue_jobs`` does (the job marked queued with its
# enqueue time, its id pushed onto its queue, the one its ``origin`` names, the entry removed), for a batch in one
# round trip and atomically
# per entry: ZREM decides who moves an entry, so any number of schedulers may move at once without duplicating
# one. (Stock rq-scheduler fetches and unpickles each job, saves it whole, then ZREMs it: ~3 round trips a timer,
# and two schedulers can both enqueue one entry.)
MOVE_DUE = """
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
local moved = 0
for _, id in ipairs(ids) do
  if redis.call('ZREM', KEYS[1], id) == 1 then
    local key = ARGV[3] .. id
    local origin = redis.call('HGET', key, 'origin')
    if origin then
      if origin == '' then origin = ARGV[5] end
      redis.call('HSET', key, 'status', 'queued', 'enqueued_at', ARGV[4])
      local qkey = ARGV[6] .. origin
      redis.call('RPUSH', qkey, id)
      redis.call('SADD', KEYS[3], qkey)
      moved = moved + 1
    end
  end
end
return {moved, #ids}
"""

# What RQ's views read as a worker's current job, for a job loopsq runs without RQ's worker bookkeeping:
# ``show_running(worker key, job id, worker name)`` when it starts, ``hide_running(worker key, job id)`` when it is
# settled. RQ 2: the worker hash's ``current_job`` field (set by the start of a dequeued job only: a worker with
# slots writes it for the jobs it takes, ``CompatWorker._show_state``). RQ 3: an execution of the job
# (``names.TAKEN_EXECUTION_ID``) in the worker's executions set, its hash as RQ's ``Execution.save`` writes it
# (times in epoch seconds), for a taken job too (``TAKE_SHOWS``).
_SHOW_RQ2 = """
local TAKE_SHOWS = false
local function show_running(wkey, id, worker) redis.call('HSET', wkey, 'current_job', id) end
local function hide_running(wkey, id) end
"""
_SHOW_RQ3 = f"""
local TAKE_SHOWS = true
local function show_running(wkey, id, worker)
  local t = redis.call('TIME')
  local ts = t[1] .. '.' .. string.format('%06d', tonumber(t[2]))
  local ekey = '{names.EXECUTION_PREFIX}' .. id .. ':{names.TAKEN_EXECUTION_ID}'
  redis.call('HSET', ekey, 'id', '{names.TAKEN_EXECUTION_ID}', 'job_id', id, 'created_at', ts, 'last_heartbeat', ts, 'worker_name', worker)
  redis.call('EXPIRE', ekey, {names.TAKEN_EXECUTION_TTL_S})
  local skey = wkey .. ':executions'
  redis.call('SADD', skey, id .. ':{names.TAKEN_EXECUTION_ID}')
  if redis.call('TTL', skey) < 0 then redis.call('EXPIRE', skey, {names.TAKEN_EXECUTION_TTL_S}) end
end
local function hide_running(wkey, id)
  redis.call('DEL', '{names.EXECUTION_PREFIX}' .. id .. ':{names.TAKEN_EXECUTION_ID}')
  redis.call('SREM', wkey .. ':executions', id .. ':{names.TAKEN_EXECUTION_ID}')
end
"""
SHOW = _SHOW_RQ3 if names.WORKER_HAS_EXECUTIONS else _SHOW_RQ2

# Settle the job a worker took before (ARGV[4]; ARGV[6]: seconds it took) as RQ settles a finished job: the worker's
# successful count and working time go up (when it is an RQ worker), and the job, by its own result_ttl, is
# deleted (0, what timer jobs carry) or kept that long as finished, listed in the finished registry (KEYS[2],
# whose expired entries go on the way; no result stream: a fire's return value is in its run).
SETTLE = SHOW + """
local function settle(id, worker, now, took)
  local key = ARGV[1] .. id
  local wkey = ARGV[7] .. worker
  hide_running(wkey, id)
  if redis.call('EXISTS', wkey) == 1 then
    redis.call('HINCRBY', wkey, 'successful_job_count', 1)
    redis.call('HINCRBYFLOAT', wkey, 'total_working_time', took)
  end
  local ttl = tonumber(redis.call('HGET', key, 'result_ttl') or '0') or 0
  if ttl <= 0 then
    redis.call('DEL', key)
    return
  end
  redis.call('HSET', key, 'status', 'finished', 'ended_at', ARGV[5])
  redis.call('HDEL', key, 'loopsq_taken')
  redis.call('EXPIRE', key, ttl)
  local t = redis.call('TIME')
  local now_s = tonumber(t[1])
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now_s)
  redis.call('ZADD', KEYS[2], now_s + ttl, id)
end
"""

# Take the fire entry at the head of the queue, if the head is one (anything else is left for RQ, in order): pop
# it and mark its job started by this worker, as RQ would, so maintenance counts the timer in flight while this
# live worker runs it. The job taken before (ARGV[4]) is done: settled in the same round trip.
TAKE_FIRE = SETTLE + """
if ARGV[4] ~= '' then settle(ARGV[4], ARGV[3], ARGV[5], ARGV[6]) end
while true do
  local id = redis.call('LINDEX', KEYS[1], 0)
  if not id or string.sub(id, 1, #ARGV[2]) ~= ARGV[2] then return false end
  redis.call('LPOP', KEYS[1])
  local key = ARGV[1] .. id
  if redis.call('EXISTS', key) == 1 then
    redis.call('HSET', key, 'status', 'started', 'worker_name', ARGV[3], 'started_at', ARGV[5], 'loopsq_taken', '1')
    if TAKE_SHOWS and redis.call('EXISTS', ARGV[7] .. ARGV[3]) == 1 then show_running(ARGV[7] .. ARGV[3], id, ARGV[3]) end
    return {id, redis.call('HGET', key, 'enqueued_at') or ''}
  end
end
"""

FINISH = SETTLE + """
settle(ARGV[4], ARGV[3], ARGV[5], ARGV[6])
return 1
"""

# A timer job that RQ dequeued for this worker is run as loopsq runs the ones it takes (``take_fire``), without RQ's
# per-job bookkeeping: out of RQ's intermediate list (RQ's dequeue moved it there), marked started by this worker,
# and the worker shown busy with it, as RQ would show it. KEYS: the intermediate list, the job, the RQ worker.
START_DEQUEUED = SHOW + """
redis.call('LREM', KEYS[1], 1, ARGV[1])
if redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('HSET', KEYS[2], 'status', 'started', 'worker_name', ARGV[2], 'started_at', ARGV[3], 'loopsq_taken', '1')
end
if redis.call('EXISTS', KEYS[3]) == 1 then
  redis.call('HSET', KEYS[3], 'state', 'busy')
  show_running(KEYS[3], ARGV[1], ARGV[2])
end
return 1
"""

# What RQ's ``Job.delete(remove_from_queue=False)`` does, without reading first: every execution of the job (its
# hash, its member in the started registry), the executions registry, the job's member in each other registry of
# its queue (RQ removes it from the one its status names; ZREM of an absent member changes nothing), and the job's
# hash, dependents and dependencies keys. KEYS: job, dependents, dependencies, executions, started, the others.
# ARGV: the execution hash prefix of the job, the job id.
LEAN_DELETE = """
for _, eid in ipairs(redis.call('ZRANGE', KEYS[4], 0, -1)) do
  redis.call('DEL', ARGV[1] .. eid)
  redis.call('ZREM', KEYS[5], ARGV[2] .. ':' .. eid)
end
redis.call('DEL', KEYS[4])
for i = 6, #KEYS do redis.call('ZREM', KEYS[i], ARGV[2]) end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
return 1
"""
