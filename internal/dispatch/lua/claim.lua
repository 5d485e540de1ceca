-- claim: lease up to n due tasks of one queue.
--
-- "Now" is the Redis clock (TIME), in whole milliseconds. A task is due when its score
-- is <= now. Due tasks with a priority (KEYS[6]) are taken first, highest priority
-- first; then the others, in score order. Within a priority, tasks come in score order
-- too; tasks with equal scores come in lexicographic order of their ids (ZSET order):
-- there is no FIFO promise. A priority never makes a task start before it is due.
-- Each claimed task leaves ready, gets status "a", attempt+1 and a fresh lease token,
-- and enters active with the lease deadline as its score. A ready member without a
-- ready task hash is dropped.
--
-- KEYS[1]  ready ZSET
-- KEYS[2]  active ZSET
-- KEYS[3]  task hash key prefix
-- KEYS[4]  the queue's controls HASH (ctl.lua): while its p is "1" the queue is
--          paused and nothing is claimed (next_ms -1: the worker sleeps until the
--          resume's wake-up). While its r is set (r starts per w ms, bursts of b),
--          the starts are rate limited by GCRA on the Redis clock: g holds the
--          theoretical arrival time in ms; a start at now is allowed while
--          g - now < (b - 1) * T, T = w / r, and each start moves g on by T
--          (from now when g is past); in a queue of n shards (its n) each shard
--          takes T = n * w / r and a burst of b / n (at least 1). Only the claim
--          script writes g. Its y flags
--          the priority index (KEYS[6]): set by the scripts that add to it
--          (lib.lua prio_add), cleared here when the index is found empty.
-- KEYS[5]  the queue's history hash prefix (Keys.History): the claim adds each task's
--          lateness (now - due, or now - the last resume, KEYS[4]'s u, when the
--          task fell due while the queue was paused: paused time is no worker's
--          lateness) to the hash of the current minute, KEYS[5] .. minute
--          (field "l<b>", bucket b of hist_bucket), kept 2 hours. One hash per queue
--          and minute, whatever the number of tasks.
-- KEYS[6]  the queue's priority index (lib.lua prio_score): the ready tasks with a
--          priority, each in ready too. Only while the controls' y is set is it
--          read, band by band from the highest priority, taking the due tasks of
--          each; an entry whose task left ready is dropped, one whose ready score is
--          later moves to it (never claimed early). Then ready fills the rest, in
--          due order. A queue without priorities pays nothing for them: y is one
--          more field of the HMGET the controls took already.
-- KEYS[7]  the queue's concurrency-key prefix (Keys.KeyPrefix; lib.lua key_admit):
--          read only while KEYS[4] holds a cap per key (kc, 1..10^5 runs at once)
--          or a throttle per key (kn starts per kw ms, kn 1..10^4): then a task
--          whose hash holds a key k starts only while its key has fewer than kc
--          runs holding a slot (KEYS[7] .. 'run') and fewer than kn starts in the
--          last kw ms (KEYS[7] .. 's:' .. k, a ZSET of start times, TTL kw); else
--          it is parked (KEYS[7] .. 'p:' .. k) and the claim goes on with the next
--          due task, so a capped key never holds back another key's tasks. At
--          most 1000 tasks are parked by one call (then next_ms is 0: claim
--          again). A key held by its throttle is in KEYS[7] .. 'wake' with the
--          time its window lets the next start in; the claim readmits one parked
--          task of each key whose time came, and next_ms counts those times too.
--          A task claimed past its start deadline takes no slot and no start.
--          With limits the queue is fair (lib.lua key_place): ready holds one task
--          of each key, its head (KEYS[7] .. 'h'); starting a head promotes the
--          key's next task from KEYS[7] .. 'p:' .. k at max(due, now), its turn
--          (with a cap, only while the key has room left), and the claim reports
--          the head's due time kept in KEYS[7] .. 'h', not its turn.
-- ARGV[1]  n, most tasks to claim (0..1000; 0 claims nothing and reports next_ms
--          and rate_ms: a sharded queue's claim asks every shard, some for none)
-- ARGV[2]  lease in milliseconds (1..2^40)
-- ARGV[3]  token base, 1..64 bytes (random per call); token k is "<base>.<k>"
--
-- A task whose hash holds a start deadline d (Unix ms, enqueue.lua) and that is
-- claimed after it (now > d) is leased like the others, for the worker to settle
-- without running it (Postgres first: dead, or handed to the queue's hook); it
-- does not count as a start against the rate limit.
--
-- Returns { next_ms, now, lease_until, count, rate_ms, shards, resumed, then count groups of 9:
--           id, payload, attempt, max_attempts, version, token, due, trace, start_by }
--   next_ms      ms from now until the earliest task still in ready falls due:
--                0 if one is due already, -1 if ready is empty
--   rate_ms      when tasks are still due (next_ms 0) but the rate limit allows no
--                further start now: ms until it allows the next one (rounded up);
--                else 0
--   shards       the queue's shard count as KEYS[4] holds it (its n), 0 when it
--                holds none: a Client that routed by another count learns the
--                new one from its next claim (it reads n anyway)
--   resumed      the queue's last resume (KEYS[4]'s u), "" if none: a task due
--                before it waited for the pause, not for a worker
--   now, lease_until, resumed, due, start_by   Unix seconds with 3 decimals (strings);
--                start_by "" for a task without a deadline
-- Malformed ARGV: an error reply, nothing written.

if #ARGV ~= 3 then return fail('expected 3 arguments, got ' .. #ARGV) end
local n = int(ARGV[1], 0, 1000)
if n == nil then return fail('n must be an integer in 0..1000') end
local lease = int(ARGV[2], 1, 1099511627776)
if lease == nil then return fail('lease must be an integer number of ms in 1..2^40') end
local base = ARGV[3]
if #base == 0 or #base > 64 then return fail('token base must have 1..64 bytes') end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local until_s = fmt(now + lease)

local ctl = redis.call('HMGET', KEYS[4], 'p', 'r', 'w', 'b', 'g', 'y', 'n', 'u', 'kc', 'kn', 'kw')
local held = tonumber(ctl[7]) or 0
local resumed = tonumber(ctl[8]) or 0
local resumed_s = ''
if resumed > 0 then resumed_s = fmt(resumed) end
if ctl[1] == '1' then return { -1, fmt(now), until_s, 0, 0, held, resumed_s } end

-- The rate limit (GCRA): allowed is how many starts it lets happen now.
local rate = tonumber(ctl[2]) or 0
local emit, burst, tat = 0, 0, 0
if rate > 0 then
  -- A shard of a queue of n shards takes its share: r per n * w, burst b / n.
  local shards = math.max(held, 1)
  emit = (tonumber(ctl[3]) or 1000) * shards / rate
  burst = math.max(1, math.floor((tonumber(ctl[4]) or 1) / shards))
  tat = math.max(tonumber(ctl[5]) or 0, now)
  -- The 1e-6 keeps a start that falls due exactly now from being lost to rounding.
  local allowed = math.floor((now - tat) / emit + burst + 1e-6)
  if allowed < 1 then
    local h = redis.call('ZRANGE', KEYS[1], '-inf', fmt(now), 'BYSCORE', 'LIMIT', 0, 1)
    if #h == 0 then
      local next_ms = -1
      local e = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
      if e[2] then next_ms = math.max(math.floor(tonumber(e[2]) * 1000 + 0.5) - now, 0) end
      return { next_ms, fmt(now), until_s, 0, 0, held, resumed_s }
    end
    return { 0, fmt(now), until_s, 0, math.max(math.ceil(tat + emit * (1 - burst) - now - 1e-6), 1), held, resumed_s }
  end
  if allowed < n then n = allowed end
end

local out = {}
local count, missed = 0, 0
local leased = {}
local hist = {}

-- Concurrency keys: only while the queue caps or throttles its keys.
local kcap = tonumber(ctl[9]) or 0
local klim = tonumber(ctl[10]) or 0
local kwin = tonumber(ctl[11]) or 1000
local keyed = kcap > 0 or klim > 0
local kp = KEYS[7]
local parked = 0
local running = {} -- key -> runs holding a slot, read once per call

-- key_room is how many more tasks of key k may start now (math.huge: no bound),
-- and, when its throttle is what stops it, the time (Unix ms) it lets one in.
local function key_room(k)
  local room, opens = math.huge, nil
  if kcap > 0 then
    if running[k] == nil then running[k] = tonumber(redis.call('HGET', kp .. 'run', k)) or 0 end
    room = kcap - running[k]
  end
  if klim > 0 then
    local log = kp .. 's:' .. k
    redis.call('ZREMRANGEBYSCORE', log, '-inf', now - kwin)
    local used = redis.call('ZCARD', log)
    if klim - used < room then room = klim - used end
    if used >= klim then
      local first = redis.call('ZRANGE', log, used - klim, used - klim, 'WITHSCORES')
      opens = tonumber(first[2]) + kwin
    end
  end
  return room, opens
end

-- key_start counts a start of key k: a slot, and a start in its throttle's log.
local function key_start(h, k, id)
  if kcap > 0 then
    running[k] = running[k] + 1
    redis.call('HINCRBY', kp .. 'run', k, 1)
    redis.call('HSET', h, 'q', '1')
  end
  if klim > 0 then
    local log = kp .. 's:' .. k
    redis.call('ZADD', log, now, id .. '@' .. now)
    redis.call('PEXPIRE', log, kwin)
  end
end

-- take leases task id, due at due_ms, unless its hash is not a ready task's (then its
-- ZSET member, already removed, is simply dropped). Two hash commands per task.
local function take(id, due_ms)
  local h = KEYS[3] .. id
  local f = redis.call('HMGET', h, 's', 'p', 'm', 'v', 'a', 'c', 'd', 'k')
  -- Fields at their defaults are absent (Keys.TaskKey): no status but a payload
  -- is ready, no m is 25, no v is 1.
  if f[1] == 'r' or (f[1] == false and f[2] ~= false) then
    -- The head of its key leaves ready (fair dispatch, lib.lua key_place): its
    -- score was its key's turn, its due time is the one kept in kp .. 'h'. The
    -- entry goes unless the key's next head overwrites it.
    local head = false
    if keyed and f[8] then
      local hd, hdue = key_head(kp, f[8])
      if hd == id then head, due_ms = true, hdue end
    end
    local late = f[7] and now > tonumber(f[7])
    if keyed and f[8] and not late then
      local room, opens = key_room(f[8])
      if room < 1 then
        if head then redis.call('HDEL', kp .. 'h', f[8]) end
        key_park(kp, f[8], fmt(due_ms), id)
        if opens then redis.call('ZADD', kp .. 'wake', 'LT', opens, f[8]) end
        parked = parked + 1
        return
      end
      key_start(h, f[8], id)
      -- Room left: the key's next task becomes its head, at its turn (a slot
      -- given back readmits one, so a key at its cap waits for that). Without a
      -- cap the throttle judges the head when it comes up.
      local moved = 0
      if room > 1 or kcap == 0 then moved = key_admit(kp, KEYS[1], KEYS[6], KEYS[4], KEYS[3], f[8], 1, true, now, head) end
      if head and moved == 0 then redis.call('HDEL', kp .. 'h', f[8]) end
    elseif keyed and f[8] then
      -- Settled without a run, it takes no slot: the next one comes back instead.
      if key_admit(kp, KEYS[1], KEYS[6], KEYS[4], KEYS[3], f[8], 1, true, now, head) == 0 and head then
        redis.call('HDEL', kp .. 'h', f[8])
      end
    end
    local attempt = (tonumber(f[5]) or 0) + 1
    count = count + 1
    local token = base .. '.' .. count
    redis.call('HSET', h, 's', 'a', 't', token, 'a', attempt)
    leased[#leased + 1] = until_s
    leased[#leased + 1] = id
    local k = #out
    out[k + 1] = id
    out[k + 2] = f[2] or ''
    out[k + 3] = attempt
    out[k + 4] = tonumber(f[3]) or 25
    out[k + 5] = tonumber(f[4]) or 1
    out[k + 6] = token
    out[k + 7] = fmt(due_ms)
    out[k + 8] = f[6] or ''
    out[k + 9] = ''
    if f[7] then
      out[k + 9] = fmt(tonumber(f[7]))
      if late then missed = missed + 1 end
    end
    local b = 'l' .. hist_bucket(now - math.max(due_ms, resumed))
    hist[b] = (hist[b] or 0) + 1
  end
end

-- Keys whose throttle window opened: one parked task of each back into ready.
if klim > 0 then
  local open = redis.call('ZRANGE', kp .. 'wake', '-inf', now, 'BYSCORE', 'LIMIT', 0, 100)
  for _, k in ipairs(open) do
    redis.call('ZREM', kp .. 'wake', k)
    key_admit(kp, KEYS[1], KEYS[6], KEYS[4], KEYS[3], k, 1, true, now)
  end
end

-- The due tasks with a priority first, band by band (a band is one priority).
local prio = ctl[6] ~= false
if prio then
  local band = 0
  while count < n and band < 9 do
    local hd = redis.call('ZRANGE', KEYS[6], prio_score(9 - band, 0), '+inf', 'BYSCORE', 'LIMIT', 0, 1, 'WITHSCORES')
    if not hd[2] then
      if band == 0 then redis.call('HDEL', KEYS[4], 'y') end -- the index is empty
      break
    end
    band = math.floor(tonumber(hd[2]) / PRIO_BAND)
    local got = redis.call('ZRANGE', KEYS[6], prio_score(9 - band, 0), prio_score(9 - band, now), 'BYSCORE', 'LIMIT', 0, n - count)
    if #got == 0 then band = band + 1 end
    for _, id in ipairs(got) do
      redis.call('ZREM', KEYS[6], id)
      local rs = redis.call('ZSCORE', KEYS[1], id)
      if rs then
        local due_ms = score_ms(rs)
        if due_ms <= now then
          redis.call('ZREM', KEYS[1], id)
          take(id, due_ms)
        else
          redis.call('ZADD', KEYS[6], prio_score(9 - band, due_ms), id)
        end
      end
    end
  end
end

-- Then the rest of ready, in due order: one ZREM (two with priorities) for all.
-- Without keys this runs once; a task parked for its key makes room for the next
-- due task, so the claim reads on (at most 1000 parked a call).
while count < n and parked < 1000 do
  local due = redis.call('ZRANGE', KEYS[1], '-inf', fmt(now), 'BYSCORE', 'LIMIT', 0, n - count, 'WITHSCORES')
  if #due == 0 then break end
  local ids = {}
  for i = 1, #due, 2 do ids[#ids + 1] = due[i] end
  redis.call('ZREM', KEYS[1], unpack(ids))
  if prio then redis.call('ZREM', KEYS[6], unpack(ids)) end
  for i = 1, #due, 2 do take(due[i], score_ms(due[i + 1])) end
  if not keyed then break end
end
if #leased > 0 then
  redis.call('ZADD', KEYS[2], unpack(leased))
  hist_add(KEYS[5], now, hist)
end

local next_ms = -1
local h = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if h[2] then
  next_ms = math.floor(tonumber(h[2]) * 1000 + 0.5) - now
  if next_ms < 0 then next_ms = 0 end
end
if klim > 0 then
  local w = redis.call('ZRANGE', kp .. 'wake', 0, 0, 'WITHSCORES')
  if w[2] then
    local wait = math.max(tonumber(w[2]) - now, 1)
    if next_ms < 0 or wait < next_ms then next_ms = wait end
  end
end

local rate_ms = 0
if rate > 0 and count > missed then
  tat = tat + (count - missed) * emit
  redis.call('HSET', KEYS[4], 'g', string.format('%.3f', tat))
  if next_ms == 0 then rate_ms = math.max(math.ceil(tat + emit * (1 - burst) - now - 1e-6), 0) end
end

local reply = { next_ms, fmt(now), until_s, count, rate_ms, held, resumed_s }
for i = 1, #out do reply[7 + i] = out[i] end
return reply
