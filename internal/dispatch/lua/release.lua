-- release: hand a lease back without using up the attempt (worker shutdown, a
-- snoozed run, a dead hook that failed).
--
-- Only if the token still holds the lease: the task returns to ready, due now plus
-- the delay (Redis clock), with attempt - 1 (never below 0), so the run is not
-- counted.
--
-- KEYS[1]  ready ZSET
-- KEYS[2]  active ZSET
-- KEYS[3]  task hash key prefix
-- KEYS[4]  priority index ZSET: a task with a priority goes back into it
-- KEYS[5]  controls HASH (its field y flags the index: lib.lua prio_add)
-- KEYS[6]  concurrency-key prefix: a run that held a slot of its key gives it back
--          (lib.lua key_free)
-- ARGV[1]  wake channel
-- ARGV[2]  task id (1..200 bytes)
-- ARGV[3]  lease token (1..100 bytes)
-- ARGV[4]  delay in milliseconds (0..2^40), optional: 0
-- Returns 1 released, 0 lease lost (nothing changed).
-- PUBLISHes on the wake channel when the task became the earliest in ready.
-- Malformed ARGV: an error reply, nothing written.

if #ARGV ~= 3 and #ARGV ~= 4 then return fail('expected 3 or 4 arguments, got ' .. #ARGV) end
if ARGV[1] == '' then return fail('empty wake channel') end
local id, token = ARGV[2], ARGV[3]
if #id == 0 or #id > 200 then return fail('id must have 1..200 bytes') end
if #token == 0 or #token > 100 then return fail('token must have 1..100 bytes') end
local delay = 0
if #ARGV == 4 then
  delay = int(ARGV[4], 0, 1099511627776)
  if delay == nil then return fail('delay must be an integer number of ms in 0..2^40') end
end

local h = KEYS[3] .. id
local f = redis.call('HMGET', h, 's', 't', 'a', 'y', 'k', 'q')
if f[1] ~= 'a' or f[2] ~= token then return 0 end
if f[6] and key_free(KEYS[6], KEYS[1], KEYS[4], KEYS[5], KEYS[3], h, f[5], f[6]) > 0 then
  redis.call('PUBLISH', ARGV[1], '0')
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local hd = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
redis.call('ZREM', KEYS[2], id)
redis.call('HDEL', h, 't')
local attempt = (tonumber(f[3]) or 0) - 1
if attempt > 0 then
  redis.call('HSET', h, 's', 'r', 'a', attempt)
else
  redis.call('HSET', h, 's', 'r')
  redis.call('HDEL', h, 'a')
end
local score = now + delay
redis.call('ZADD', KEYS[1], fmt(score), id)
prio_add(KEYS[4], KEYS[5], id, f[4], score)
if hd[2] == nil or score < math.floor(tonumber(hd[2]) * 1000 + 0.5) then
  redis.call('PUBLISH', ARGV[1], fmt(score))
end
return 1
