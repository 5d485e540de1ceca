-- repair: compare-and-set repairs of some tasks of one queue, for reconcile.
--
-- Each repair carries the fingerprint probe.lua returned for its task. It is applied
-- only if the task's hash and memberships are exactly as they were then; otherwise
-- nothing is done to that task (someone changed it: a claim, a completion, a relay,
-- another reconcile) and the caller looks again later. So a repair never undoes a
-- change it did not see.
--
-- Operations:
--   remove   delete the task hash and the id from ready, active and dead
--   restore  the same, then write the task afresh as enqueue writes a new one
--            (lib.lua write_task): ready, the given payload, max_attempts, attempt,
--            version, trace context, start deadline and priority (fields at their
--            defaults left out), in ready at the given due time (and in the
--            priority index, with a priority)
--   expire   for an active task that lost its place in active (or sits in another
--            ZSET too): drop it from ready and dead, and add it to active with score
--            0 unless it is there, so the reaper takes it back like an expired lease
--   kill     for a task Postgres has made dead: status dead with the given error,
--            its lease revoked, in dead only (score now), its payload kept
--
-- KEYS[1]  ready ZSET
-- KEYS[2]  active ZSET
-- KEYS[3]  dead ZSET
-- KEYS[4]  task hash key prefix
-- KEYS[5]  priority index ZSET: every op takes the id out of it; restore puts a task
--          with a priority back
-- KEYS[6]  controls HASH (its field y flags the index: lib.lua prio_add)
-- KEYS[7]  concurrency-key prefix: every op takes a parked task out of its key's
--          parked set and gives back the slot of a run it ends (lib.lua key_free);
--          restore writes the task's key
-- ARGV[1]  wake channel
-- ARGV[2]  n, number of repairs (1..1000)
-- then for repair k = 0..n-1, ARGV[3+12k] .. ARGV[14+12k]:
--   op            "remove", "restore" or "expire"
--   id            1..200 bytes
--   fingerprint   as returned by probe.lua
--   due           restore: Unix seconds with up to 3 decimals, or "now"; else ""
--   payload       restore: bytes; kill: the last error (0..4096 bytes); else ""
--   max_attempts  restore: 1..1000000; else ""
--   attempt       restore: 0..1000000; else ""
--   version       restore: 1..2147483647; else ""
--   trace         restore: 0..512 bytes, the trace context (as enqueue); else ""
--   start_by      restore: "" or the start deadline in Unix ms (as enqueue); else ""
--   priority      restore: 0..9 (as enqueue); else ""
--   key           restore: "" or the concurrency key, 1..200 bytes (as enqueue); else ""
--   (restore's fields after the fingerprint are enqueue's after the id: the Go
--   client writes both with one function, Client.appendTask)
--
-- Returns an array of n integers: 1 applied, 0 changed since the probe, or a kill or
-- expire of a task without a hash (nothing done).
-- PUBLISHes the new head score on the wake channel when a restore moved the earliest
-- due time of the queue earlier. Malformed ARGV: an error reply, nothing written.

-- Identical to read() in probe.lua.
local function read(id, kp)
  local f = redis.call('HMGET', KEYS[4] .. id, 's', 'v', 'a', 'm', 't', 'k')
  -- Fields at their defaults are absent (Keys.TaskKey); report their values.
  if f[1] == false and redis.call('HEXISTS', KEYS[4] .. id, 'p') == 1 then f[1] = 'r' end
  if f[1] then
    f[2] = f[2] or '1'
    if f[1] ~= 'd' then f[4] = f[4] or '25' end
  end
  local rs = redis.call('ZSCORE', KEYS[1], id) or ''
  -- A task parked for its concurrency key (claim.lua) is ready, at its score.
  if rs == '' and f[6] then rs = redis.call('ZSCORE', kp .. 'p:' .. f[6], id) or '' end
  local as = redis.call('ZSCORE', KEYS[2], id) or ''
  local ds = redis.call('ZSCORE', KEYS[3], id) or ''
  local s, v, a, m, t = f[1] or '', f[2] or '', f[3] or '', f[4] or '', f[5] or ''
  return { s, v, a, m, rs, as, ds, table.concat({ s, v, a, m, t, rs, as, ds }, '|') }
end

local function head()
  local h = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  if h[2] then return tonumber(h[2]) end
  return nil
end

local W = 12
local n = int(ARGV[2], 1, 1000)
if n == nil then return fail('n must be an integer in 1..1000') end
if #ARGV ~= 2 + W * n then return fail('expected ' .. (2 + W * n) .. ' arguments, got ' .. #ARGV) end
if ARGV[1] == '' then return fail('empty wake channel') end

-- Validate everything before writing anything.
local now = nil
local reps = {}
for k = 0, n - 1 do
  local b = 3 + W * k
  local op, id = ARGV[b], ARGV[b + 1]
  if #id == 0 or #id > 200 then return fail('repair ' .. k .. ': id must have 1..200 bytes') end
  local r = { op = op, id = id, fp = ARGV[b + 2] }
  if op == 'restore' then
    local due = ARGV[b + 3]
    if due == 'now' then
      if now == nil then
        local t = redis.call('TIME')
        now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
      end
      r.score = fmt(now)
    else
      if not (string.match(due, '^%d+$') or string.match(due, '^%d+%.%d%d?%d?$')) then
        return fail('repair ' .. k .. ': due must be seconds with at most 3 decimals or "now"')
      end
      local ms = math.floor(tonumber(due) * 1000 + 0.5)
      if ms > 1e14 then return fail('repair ' .. k .. ': due too far in the future') end
      r.score = fmt(ms)
    end
    r.payload = ARGV[b + 4]
    r.max = int(ARGV[b + 5], 1, 1000000)
    if r.max == nil then return fail('repair ' .. k .. ': max_attempts must be an integer in 1..1000000') end
    r.attempt = int(ARGV[b + 6], 0, 1000000)
    if r.attempt == nil then return fail('repair ' .. k .. ': attempt must be an integer in 0..1000000') end
    r.ver = int(ARGV[b + 7], 1, 2147483647)
    if r.ver == nil then return fail('repair ' .. k .. ': version must be an integer in 1..2147483647') end
    r.trace = ARGV[b + 8]
    if #r.trace > 512 then return fail('repair ' .. k .. ': trace context must have 0..512 bytes') end
    if ARGV[b + 9] ~= '' then
      if int(ARGV[b + 9], 1, 1e14) == nil then return fail('repair ' .. k .. ': start_by must be "" or Unix ms in 1..10^14') end
      r.d = ARGV[b + 9]
    end
    r.y = int(ARGV[b + 10], 0, 9)
    if r.y == nil then return fail('repair ' .. k .. ': priority must be an integer in 0..9') end
    r.key = ARGV[b + 11]
    if #r.key > 200 then return fail('repair ' .. k .. ': key must have 0..200 bytes') end
  elseif op == 'kill' then
    r.msg = ARGV[b + 4]
    if #r.msg > 4096 then return fail('repair ' .. k .. ': last error longer than 4096 bytes') end
  elseif op ~= 'remove' and op ~= 'expire' then
    return fail('repair ' .. k .. ': unknown op "' .. op .. '"')
  end
  reps[k + 1] = r
end

local before = head()
local out = {}
for i, r in ipairs(reps) do
  local id = r.id
  local h = KEYS[4] .. id
  local cur = read(id, KEYS[7])
  if cur[8] ~= r.fp or (r.op == 'expire' and cur[1] ~= 'a') or (r.op == 'kill' and cur[1] == '') then
    out[i] = 0
  else
    redis.call('ZREM', KEYS[5], id)
    local kq = redis.call('HMGET', h, 'k', 'q')
    if kq[1] then
      key_unpark(KEYS[7], kq[1], id)
      if r.op ~= 'expire' then key_free(KEYS[7], KEYS[1], KEYS[5], KEYS[6], KEYS[4], h, kq[1], kq[2]) end
    end
    if r.op == 'kill' then
      if now == nil then
        local t = redis.call('TIME')
        now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
      end
      redis.call('ZREM', KEYS[1], id)
      redis.call('ZREM', KEYS[2], id)
      redis.call('HDEL', h, 't')
      redis.call('HSET', h, 's', 'x', 'e', r.msg)
      redis.call('PERSIST', h)
      redis.call('ZADD', KEYS[3], fmt(now), id)
    elseif r.op == 'expire' then
      redis.call('ZREM', KEYS[1], id)
      redis.call('ZREM', KEYS[3], id)
      redis.call('ZADD', KEYS[2], 'NX', 0, id)
    else
      redis.call('ZREM', KEYS[1], id)
      redis.call('ZREM', KEYS[2], id)
      redis.call('ZREM', KEYS[3], id)
      redis.call('DEL', h)
      if r.op == 'restore' then
        write_task(h, r.payload, r.max, r.ver, r.attempt, r.trace, r.d, r.y, r.key)
        if r.key ~= '' and key_fair(KEYS[6]) then
          -- A fair queue (lib.lua key_place): its key's head, or in its key's ZSET.
          key_place(KEYS[7], KEYS[1], KEYS[5], KEYS[6], r.key, id, r.score, r.y)
        else
          redis.call('ZADD', KEYS[1], r.score, id)
          prio_add(KEYS[5], KEYS[6], id, r.y, score_ms(r.score))
        end
      end
    end
    -- A removed head of its key (fair dispatch): the key's next task takes its place.
    if kq[1] and r.op ~= 'restore' and r.op ~= 'expire' then
      key_gone(KEYS[7], KEYS[1], KEYS[5], KEYS[6], KEYS[4], kq[1], id)
    end
    out[i] = 1
  end
end

local after = head()
if after ~= nil and (before == nil or after < before) then
  redis.call('PUBLISH', ARGV[1], string.format('%.3f', after))
end
return out
