-- enqueue: add tasks to one queue, each unless its task hash already exists.
--
-- The task hash is the Redis dedupe record: it exists from enqueue until its
-- done-retention TTL runs out (or until remove). An existing hash makes the task a
-- duplicate, except when the given version is higher than the stored one (a
-- Reschedule in the outbox, which only ever reaches a task Postgres has not finished),
-- or when it is finished and ARGV[3] says the caller holds the live row: then score,
-- payload, max_attempts, attempts and version are replaced, whatever the status — a
-- lease is revoked, a dead or done copy of the older version is brought back.
--
-- KEYS[1]  ready ZSET            "<prefix>:{<queue>}:ready"
-- KEYS[2]  active ZSET           "<prefix>:{<queue>}:active"
-- KEYS[3]  task hash key prefix  "<prefix>:{<queue>}:t:"
-- KEYS[4]  dead ZSET             "<prefix>:{<queue>}:dead"
-- KEYS[5]  priority index ZSET   "<prefix>:{<queue>}:prio" (lib.lua prio_score)
-- KEYS[6]  controls HASH         "<prefix>:{<queue>}:ctl": field y flags the index
-- KEYS[7]  concurrency-key prefix "<prefix>:{<queue>}:k:" (lib.lua key_admit): a
--          replaced task leaves its key's parked set, and a replaced run gives
--          its slot back. While KEYS[6] holds key limits (kc or kn) the queue is
--          fair: a keyed task goes into ready only as its key's head, else into
--          its key's ZSET (lib.lua key_place)
-- ARGV[1]  wake channel          "<prefix>:{<queue>}:wake"
-- ARGV[2]  n, number of tasks (1..10000)
-- ARGV[3]  replace finished: "1" from the relay, which holds each task's outbox row
--          locked as pending: a done or dead hash of the id, of any version, is then
--          an earlier life of the id (a reused id after retention, a task retried
--          from dead) and is replaced; "0" otherwise
-- ARGV[4]  the queue's shard count the caller routed by (1..64, Controls.Shards):
--          when the controls hold another (field n), the call is refused with the
--          error "SHARDS <n>" and nothing is written; the caller reads the count
--          again and routes anew. Absent n (one shard, or controls lost with
--          Redis's data until the relay restores them) accepts any count.
-- then for task k = 0..n-1, ARGV[5+10k] .. ARGV[14+10k]:
--   id            1..200 bytes
--   due           Unix seconds with up to 3 decimals ("1700000000.125"), or "now" (Redis TIME)
--   payload       bytes
--   max_attempts  1..1000000 (validate.MaxAttempts)
--   attempt       0..1000000, attempts already used (0 for a new task)
--   version       1..2147483647, the outbox version
--   trace         0..512 bytes, the trace context of the enqueue (opaque; "" for none),
--                 kept in field c only when given, and handed to the worker by claim
--   start_by      "" (none), or the start deadline in Unix ms (1..10^14): kept in the
--                 hash as d only when set; the claim script settles a task it
--                 finds past it instead of running it
--   priority      0..9: kept in the hash as y only when not 0, and the task is then in
--                 the priority index too (higher first among the due tasks)
--   key           "" (none) or the concurrency key, 1..200 bytes: kept in the hash as
--                 k only when set; the claim script caps and throttles the runs of
--                 each key while the queue's controls say so
--
-- Returns an array of n integers: 1 added, 0 duplicate, 2 replaced (higher version).
-- PUBLISHes the new head score on the wake channel when the earliest due time of the
-- queue moved earlier. Malformed ARGV: an error reply, nothing written.

local function head()
  local h = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  if h[2] then return tonumber(h[2]) end
  return nil
end

local W = 10
local n = int(ARGV[2], 1, 10000)
if n == nil then return fail('n must be an integer in 1..10000') end
if #ARGV ~= 4 + W * n then return fail('expected ' .. (4 + W * n) .. ' arguments, got ' .. #ARGV) end
if ARGV[1] == '' then return fail('empty wake channel') end
if ARGV[3] ~= '0' and ARGV[3] ~= '1' then return fail('replace finished must be 0 or 1') end
local replace_finished = ARGV[3] == '1'
if int(ARGV[4], 1, 64) == nil then return fail('shards must be an integer in 1..64') end

-- Validate everything first (nothing is written for malformed ARGV), keeping only
-- each task's score; the second loop reads the rest from ARGV again. A given due is
-- used as the score as it is: ZADD reads the same number from it as from its
-- reformatted "%d.%03d" form.
local now = nil
local scores = {}
for k = 0, n - 1 do
  local b = 5 + W * k
  local id, due = ARGV[b], ARGV[b + 1]
  if #id == 0 or #id > 200 then return fail('task ' .. k .. ': id must have 1..200 bytes') end
  if due == 'now' then
    if now == nil then
      local t = redis.call('TIME')
      now = fmt(tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
    end
    scores[k + 1] = now
  else
    if not (string.match(due, '^%d+$') or string.match(due, '^%d+%.%d%d?%d?$')) then
      return fail('task ' .. k .. ': due must be seconds with at most 3 decimals or "now"')
    end
    if math.floor(tonumber(due) * 1000 + 0.5) > 1e14 then return fail('task ' .. k .. ': due too far in the future') end
    scores[k + 1] = due
  end
  if int(ARGV[b + 3], 1, 1000000) == nil then return fail('task ' .. k .. ': max_attempts must be an integer in 1..1000000') end
  if int(ARGV[b + 4], 0, 1000000) == nil then return fail('task ' .. k .. ': attempt must be an integer in 0..1000000') end
  if int(ARGV[b + 5], 1, 2147483647) == nil then return fail('task ' .. k .. ': version must be an integer in 1..2147483647') end
  if #ARGV[b + 6] > 512 then return fail('task ' .. k .. ': trace context must have 0..512 bytes') end
  if ARGV[b + 7] ~= '' and int(ARGV[b + 7], 1, 1e14) == nil then return fail('task ' .. k .. ': start_by must be "" or Unix ms in 1..10^14') end
  if int(ARGV[b + 8], 0, 9) == nil then return fail('task ' .. k .. ': priority must be an integer in 0..9') end
  if #ARGV[b + 9] > 200 then return fail('task ' .. k .. ': key must have 0..200 bytes') end
end

local ctl = redis.call('HMGET', KEYS[6], 'n', 'kc', 'kn')
local held = ctl[1]
if held and held ~= ARGV[4] then return redis.error_reply('SHARDS ' .. held) end
-- Fair dispatch while the queue has key limits: a keyed task goes in as its key's
-- head, or into its key's ZSET (lib.lua key_place).
local fair = (tonumber(ctl[2]) or 0) > 0 or (tonumber(ctl[3]) or 0) > 0

local before = head()
local out = {}
-- Members to add to the ready ZSET, as score, id pairs: one ZADD per chunk at the
-- end instead of one per task (the same result: a repeated id ends with its last
-- score, as with one ZADD each).
local z = {}
for i = 1, n do
  local b = 5 + W * (i - 1)
  local id, score, payload = ARGV[b], scores[i], ARGV[b + 2]
  local max, attempt, ver = tonumber(ARGV[b + 3]), tonumber(ARGV[b + 4]), tonumber(ARGV[b + 5])
  local trace = ARGV[b + 6]
  local d = ARGV[b + 7] ~= '' and ARGV[b + 7] or nil
  local y = tonumber(ARGV[b + 8])
  local key = ARGV[b + 9]
  local h = KEYS[3] .. id
  local cur = redis.call('HMGET', h, 's', 'v', 'p', 'y', 'k', 'q')
  local st = cur[1] or (cur[3] and 'r') -- false: no hash
  if st == false then
    write_task(h, payload, max, ver, attempt, trace, d, y, key)
    if fair and key ~= '' then
      key_place(KEYS[7], KEYS[1], KEYS[5], KEYS[6], key, id, score, y)
    else
      prio_add(KEYS[5], KEYS[6], id, y, score_ms(score))
      z[#z + 1] = score
      z[#z + 1] = id
    end
    out[i] = 1
  elseif (tonumber(cur[2]) or 1) < ver or (replace_finished and (st == 'd' or st == 'x')) then
    if cur[5] then
      key_unpark(KEYS[7], cur[5], id)
      if cur[6] then key_free(KEYS[7], KEYS[1], KEYS[5], KEYS[6], KEYS[3], h, cur[5], cur[6]) end
      if fair then
        -- It leaves ready to be placed anew: its key's head, if it was, moves on.
        redis.call('ZREM', KEYS[1], id)
        key_gone(KEYS[7], KEYS[1], KEYS[5], KEYS[6], KEYS[3], cur[5], id)
      end
    end
    if key ~= '' then redis.call('HSET', h, 'k', key) elseif cur[5] then redis.call('HDEL', h, 'k') end
    if st == 'a' then
      redis.call('ZREM', KEYS[2], id)
      redis.call('HDEL', h, 't')
    elseif st == 'x' then
      redis.call('ZREM', KEYS[4], id)
      redis.call('HDEL', h, 'e')
    elseif st == 'd' then
      redis.call('PERSIST', h)
    end
    redis.call('HSET', h, 's', 'r', 'p', payload, 'm', max, 'v', ver)
    if d then redis.call('HSET', h, 'd', d) else redis.call('HDEL', h, 'd') end
    -- The attempts are the given ones (the outbox's count of recorded failures):
    -- a run whose lease the replacement revoked does not count, as a released
    -- one does not.
    if attempt > 0 then
      redis.call('HSET', h, 'a', attempt)
    else
      redis.call('HDEL', h, 'a')
    end
    if trace ~= '' then
      redis.call('HSET', h, 'c', trace)
    else
      redis.call('HDEL', h, 'c')
    end
    if cur[4] then redis.call('ZREM', KEYS[5], id) end
    if y > 0 then
      redis.call('HSET', h, 'y', y)
    elseif cur[4] then
      redis.call('HDEL', h, 'y')
    end
    if fair and key ~= '' then
      redis.call('ZREM', KEYS[1], id)
      key_place(KEYS[7], KEYS[1], KEYS[5], KEYS[6], key, id, score, y)
    else
      prio_add(KEYS[5], KEYS[6], id, y, score_ms(score))
      z[#z + 1] = score
      z[#z + 1] = id
    end
    out[i] = 2
  else
    -- Duplicate. Repair a hash that lost its ZSET member, so it cannot be stuck:
    -- ready goes back to ready, active to active with an expired lease (the reaper
    -- takes it). ZADD NX leaves a present member alone.
    if st == 'r' and cur[5] and redis.call('ZSCORE', KEYS[7] .. 'p:' .. cur[5], id) then
      -- Parked for its key (claim.lua): ready already.
    elseif st == 'r' then
      redis.call('ZADD', KEYS[1], 'NX', score, id)
      if cur[4] and redis.call('ZSCORE', KEYS[5], id) == false then
        prio_add(KEYS[5], KEYS[6], id, cur[4], score_ms(redis.call('ZSCORE', KEYS[1], id)))
      end
    elseif st == 'a' then
      redis.call('ZADD', KEYS[2], 'NX', 0, id)
    end
    out[i] = 0
  end
end
local chunk = 2000 -- pairs per ZADD, well within Lua's unpack limit (8000 values)
for j = 1, #z, 2 * chunk do
  redis.call('ZADD', KEYS[1], unpack(z, j, math.min(j + 2 * chunk - 1, #z)))
end

local after = head()
if after ~= nil and (before == nil or after < before) then
  redis.call('PUBLISH', ARGV[1], string.format('%.3f', after))
end
return out
