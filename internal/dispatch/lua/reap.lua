-- reap: take back leases whose deadline has passed (Redis clock).
--
-- For up to limit members of active with a deadline < now, in deadline order:
--   attempt < max_attempts: back to ready with score now + backoff, where
--       d = min(cap, base * 2^(attempt-1)) and backoff = d/2 + d/2 * r ("equal
--       jitter"), r in [0,1) derived from the seed and the position in this call;
--   otherwise the task is exhausted: it stays active, its lease revoked, with a
--       deadline now + hold (ARGV[6]), and is reported, so that the caller makes
--       it dead in Postgres first and then settles it here (repair kill, or
--       remove); a caller that dies before settling finds it again after hold;
--   no task hash, or a hash not in status "a": the member is removed and reported
--       as an orphan, so a member whose hash vanished cannot stay stuck.
-- The token is removed, so the old holder of the lease gets "lease lost".
--
-- KEYS[1]  ready ZSET
-- KEYS[2]  active ZSET
-- KEYS[3]  dead ZSET
-- KEYS[4]  task hash key prefix
-- KEYS[5]  priority index ZSET: a requeued task with a priority goes back into it
-- KEYS[6]  controls HASH (its field y flags the index: lib.lua prio_add)
-- KEYS[7]  concurrency-key prefix: a revoked lease that held a slot of its key
--          gives it back, and one parked task of the key returns to ready
--          (lib.lua key_free): a lost worker's slot frees here
-- ARGV[1]  wake channel
-- ARGV[2]  limit (1..10000)
-- ARGV[3]  backoff base in ms (1..2^40)
-- ARGV[4]  backoff cap in ms (base..2^40)
-- ARGV[5]  jitter seed (integer 0..999999)
-- ARGV[6]  hold in ms for exhausted tasks (1..2^40)
--
-- Returns { {requeued ids}, {exhausted ids}, {orphan ids} }.
-- PUBLISHes on the wake channel when the earliest due time in ready moved earlier.
-- Malformed ARGV: an error reply, nothing written.

if #ARGV ~= 6 then return fail('expected 6 arguments, got ' .. #ARGV) end
if ARGV[1] == '' then return fail('empty wake channel') end
local limit = int(ARGV[2], 1, 10000)
if limit == nil then return fail('limit must be an integer in 1..10000') end
local base = int(ARGV[3], 1, 1099511627776)
if base == nil then return fail('backoff base must be an integer number of ms in 1..2^40') end
local cap = int(ARGV[4], base, 1099511627776)
if cap == nil then return fail('backoff cap must be an integer number of ms in base..2^40') end
local seed = int(ARGV[5], 0, 999999)
if seed == nil then return fail('seed must be an integer in 0..999999') end
local hold = int(ARGV[6], 1, 1099511627776)
if hold == nil then return fail('hold must be an integer number of ms in 1..2^40') end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function head()
  local h = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  if h[2] then return math.floor(tonumber(h[2]) * 1000 + 0.5) end
  return nil
end

local expired = redis.call('ZRANGE', KEYS[2], '-inf', '(' .. fmt(now), 'BYSCORE', 'LIMIT', 0, limit)
local before = head()
local requeued, exhausted, orphans = {}, {}, {}
local back = 0 -- parked tasks back in ready (due already)
for i, id in ipairs(expired) do
  redis.call('ZREM', KEYS[2], id)
  local h = KEYS[4] .. id
  local f = redis.call('HMGET', h, 's', 'a', 'm', 'y', 'k', 'q')
  if f[1] ~= 'a' then
    orphans[#orphans + 1] = id
  else
    redis.call('HDEL', h, 't')
    if f[6] then back = back + key_free(KEYS[7], KEYS[1], KEYS[5], KEYS[6], KEYS[4], h, f[5], f[6]) end
    local attempt = tonumber(f[2]) or 0
    if attempt < (tonumber(f[3]) or 25) then -- absent m: 25 (Keys.TaskKey)
      local d = cap
      if attempt <= 41 then d = math.min(cap, base * 2 ^ math.max(attempt - 1, 0)) end
      local r = (seed / 1000000 + i * 0.6180339887498949) % 1
      local delay = math.max(1, math.floor(d / 2 + d / 2 * r))
      redis.call('HSET', h, 's', 'r')
      redis.call('ZADD', KEYS[1], fmt(now + delay), id)
      prio_add(KEYS[5], KEYS[6], id, f[4], now + delay)
      requeued[#requeued + 1] = id
    else
      redis.call('ZADD', KEYS[2], fmt(now + hold), id)
      exhausted[#exhausted + 1] = id
    end
  end
end

local after = head()
if after ~= nil and (before == nil or after < before or back > 0) then
  redis.call('PUBLISH', ARGV[1], fmt(after))
end
return { requeued, exhausted, orphans }
