-- lib: the helpers every delayq script starts with. scriptSource (client.go) puts
-- them in front of each script, after a line `local SCRIPT = '<name>'`; this file is
-- not a script of its own.

-- fail is the error reply to a malformed call, which has written nothing.
local function fail(msg) return redis.error_reply('ERR delayq ' .. SCRIPT .. ': ' .. msg) end

-- int reads s as a decimal integer in min..max; nil when it is not one.
local function int(s, min, max)
  if type(s) ~= 'string' or not string.match(s, '^%d+$') then return nil end
  local n = tonumber(s)
  if n < min or n > max then return nil end
  return n
end

-- fmt writes a time in Unix milliseconds as Unix seconds with 3 decimals (scores,
-- and times in replies).
local function fmt(ms) return string.format('%d.%03d', math.floor(ms / 1000), ms % 1000) end


-- hist_bucket is the lateness histogram's bucket of ms milliseconds (delayq
-- LatenessBucket, in Go, is the same): 0 for less than 1 ms, else 4 buckets per
-- power of two, 1 + 4e + s for ms in [2^e (1 + s/4), 2^e (1 + (s+1)/4)), at most 120.
local function hist_bucket(ms)
  if ms < 1 then return 0 end
  local m, e = math.frexp(ms) -- ms = m * 2^e, m in [0.5, 1): exact for integers
  local b = 1 + 4 * (e - 1) + math.floor((2 * m - 1) * 4)
  if b > 120 then return 120 end
  return b
end

-- hist_add adds counts (field -> n) to the history hash of the minute of now_ms under
-- prefix, and keeps it 2 hours (Keys.History).
local function hist_add(prefix, now_ms, counts)
  local key = prefix .. math.floor(now_ms / 60000)
  for f, n in pairs(counts) do redis.call('HINCRBY', key, f, n) end
  redis.call('PEXPIRE', key, 7200000)
end

-- The priority index (Keys.Priority, KEYS named in each script): every ready task
-- with a priority y in 1..9 (field y of its hash, absent for 0) is in the queue's
-- ready ZSET as any task, and also in this ZSET with score prio_score(y, due ms):
-- (9 - y) * 10^13 + due, so the index is in order of priority, highest first, then
-- of due time (Unix ms stay below 10^13 until the year 2286). Exact in a double.
local PRIO_BAND = 1e13

local function prio_score(y, due_ms) return string.format('%.0f', (9 - y) * PRIO_BAND + due_ms) end

-- prio_add puts id, due at due_ms, into the priority index key when its hash's
-- field y (a string, or false when absent) holds a priority, and sets the field y
-- of the queue's controls hash ctl: the claim script reads the index only while
-- that flag is set (it clears it when it finds the index empty), so a queue
-- without priorities pays no command for it.
local function prio_add(key, ctl, id, y, due_ms)
  local p = tonumber(y) or 0
  if p > 0 then
    redis.call('ZADD', key, prio_score(p, due_ms), id)
    redis.call('HSET', ctl, 'y', '1')
  end
end

-- write_task writes the hash h of a new task, as enqueue writes one and repair's
-- restore writes one back: its payload and only the fields that differ from their
-- defaults (absent s = "r", a = 0, m = 25, v = 1, c = ""; see Keys.TaskKey), always in
-- this order, so that a restored task's hash is the relay's byte for byte. With a
-- small payload the hash is a 32-byte listpack instead of a 48-byte one. d is the
-- start deadline as given (a string) or nil, y the priority (a number), key the
-- concurrency key ("" for none).
local function write_task(h, payload, max, ver, attempt, trace, d, y, key)
  local f = { 'p', payload }
  if key ~= '' then f[#f + 1] = 'k'; f[#f + 1] = key end
  if y > 0 then f[#f + 1] = 'y'; f[#f + 1] = y end
  if trace ~= '' then f[#f + 1] = 'c'; f[#f + 1] = trace end
  if d then f[#f + 1] = 'd'; f[#f + 1] = d end
  if max ~= 25 then f[#f + 1] = 'm'; f[#f + 1] = max end
  if ver ~= 1 then f[#f + 1] = 'v'; f[#f + 1] = ver end
  if attempt > 0 then f[#f + 1] = 'a'; f[#f + 1] = attempt end
  redis.call('HSET', h, unpack(f))
end

-- score_ms reads a ready score (Unix seconds, 3 decimals) as Unix ms.
local function score_ms(s) return math.floor(tonumber(s) * 1000 + 0.5) end

-- Concurrency keys (Keys.KeyPrefix kp; docs/DESIGN.md "Concurrency keys and
-- throttles"). A task with a key has it in field k of its hash. While the queue
-- has a cap (controls kc) or a throttle (kn starts per kw ms), the claim script
-- counts the runs of each key: kp .. 'run' HASH key -> runs holding a slot (field
-- q "1" of the task's hash marks a run that holds one), and parks a due task whose
-- key may not start now in kp .. 'p:' .. key, a ZSET id -> ready score, instead of
-- leaving it at the head of ready. A parked task comes back into ready, with its
-- score, when its key may start again: one when a run of the key gives its slot
-- back (key_free, from every script that ends a lease), one when its throttle
-- window opens (kp .. 'wake', ZSET key -> Unix ms, read by the claim), all when
-- the queue's caps change (ctl.lua). kp .. 'keys' is the SET of keys with parked
-- tasks.

-- Fair dispatch (docs/DESIGN.md "Fair dispatch across keys"): while the queue has
-- key limits (kc or kn), a key's ready tasks wait in its ZSET kp .. 'p:' .. key
-- (score: due time) and only its head, one task, is in ready: kp .. 'h' HASH
-- key -> "<due ms>:<id>" of its head (stale once that id left ready: then the key
-- has none). A head promoted after a start takes the score max(due, now), its
-- turn: keys that waited longer come first, and none starts before its due time;
-- its due time is the one in kp .. 'h'. kp .. 'n' counts the tasks in all parked
-- ZSETs (stats, O(1)).

-- key_fair tells whether the queue of controls hash ctl dispatches fairly.
local function key_fair(ctl)
  local f = redis.call('HMGET', ctl, 'kc', 'kn')
  return (tonumber(f[1]) or 0) > 0 or (tonumber(f[2]) or 0) > 0
end

-- key_head reads key k's head: its id and due time (ms), or nil.
local function key_head(kp, k)
  local v = redis.call('HGET', kp .. 'h', k)
  if not v then return nil, nil end
  local c = string.find(v, ':', 1, true)
  return string.sub(v, c + 1), tonumber(string.sub(v, 1, c - 1))
end

-- key_park adds id, due at score (a ready score string), to key k's parked ZSET.
local function key_park(kp, k, score, id)
  local added = redis.call('ZADD', kp .. 'p:' .. k, score, id)
  if added > 0 then redis.call('INCRBY', kp .. 'n', added) end
  redis.call('SADD', kp .. 'keys', k)
end

-- key_unpark takes id out of key k's parked ZSET, if there.
local function key_unpark(kp, k, id)
  local n = redis.call('ZREM', kp .. 'p:' .. k, id)
  if n > 0 then redis.call('DECRBY', kp .. 'n', n) end
  return n
end

-- key_place puts ready task id of key k (due at score, priority y) in ready as
-- its key's head when the key has none there; else parks it, unless it is due
-- before the head: then it takes the head's place (and its turn) and the head
-- is parked at its due time. Used by enqueue and restore in a fair queue.
local function key_place(kp, ready, prio, ctl, k, id, score, y)
  local due = score_ms(score)
  local hd, hdue = key_head(kp, k)
  local hs = hd and hd ~= id and redis.call('ZSCORE', ready, hd)
  if hs then
    if due >= hdue then
      key_park(kp, k, score, id)
      return
    end
    redis.call('ZREM', ready, hd)
    redis.call('ZREM', prio, hd)
    -- A head whose score is later than its due time holds its key's turn.
    if score_ms(hs) > hdue and score_ms(hs) > due then score = hs end
    key_park(kp, k, fmt(hdue), hd)
  end
  redis.call('ZADD', ready, score, id)
  redis.call('HSET', kp .. 'h', k, due .. ':' .. id)
  prio_add(prio, ctl, id, y, score_ms(score))
end

-- key_admit moves up to count of key k's parked tasks back into ready (and the
-- priority index), earliest first; returns how many. In a fair queue (fair: a
-- boolean, or nil to read the controls) it moves one, and only when the key has
-- no head in ready (headless: the caller knows it has none), at its turn
-- (max(due, now); now in Unix ms, nil to read TIME).
local function key_admit(kp, ready, prio, ctl, tprefix, k, count, fair, now, headless)
  local park = kp .. 'p:' .. k
  if fair == nil then fair = key_fair(ctl) end
  if fair then
    if not headless then
      local hd = key_head(kp, k)
      if hd and redis.call('ZSCORE', ready, hd) then return 0 end
    end
    count = 1
  end
  local got = redis.call('ZPOPMIN', park, count)
  for i = 1, #got, 2 do
    local id, s = got[i], got[i + 1]
    if fair then
      if now == nil then
        local t = redis.call('TIME')
        now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
      end
      local due = score_ms(s)
      if now > due then s = fmt(now) end
      redis.call('HSET', kp .. 'h', k, due .. ':' .. id)
    end
    redis.call('ZADD', ready, s, id)
    prio_add(prio, ctl, id, redis.call('HGET', tprefix .. id, 'y'), score_ms(s))
  end
  if #got > 0 then
    redis.call('DECRBY', kp .. 'n', #got / 2)
    if redis.call('EXISTS', park) == 0 then redis.call('SREM', kp .. 'keys', k) end
  end
  return #got / 2
end

-- key_gone is called when ready task id of key k left ready (removed): if it
-- was its key's head, the key's next task becomes the head.
local function key_gone(kp, ready, prio, ctl, tprefix, k, id)
  if key_head(kp, k) == id then
    redis.call('HDEL', kp .. 'h', k)
    key_admit(kp, ready, prio, ctl, tprefix, k, 1, nil, nil, true)
  end
end

-- key_free gives back the slot held by the run of the task in hash h, of key k
-- (its fields k and q, read by the caller: q is "1" while it holds one), and
-- readmits one parked task of the key. Returns how many came back (0 or 1), so
-- the caller wakes the workers. A task without a slot changes nothing.
local function key_free(kp, ready, prio, ctl, tprefix, h, k, q)
  if not k or q ~= '1' then return 0 end
  if redis.call('HINCRBY', kp .. 'run', k, -1) <= 0 then redis.call('HDEL', kp .. 'run', k) end
  if redis.call('EXISTS', h) == 1 then redis.call('HDEL', h, 'q') end
  return key_admit(kp, ready, prio, ctl, tprefix, k, 1)
end
