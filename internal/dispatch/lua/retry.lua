-- retry: give a failed attempt back, only if the token still holds the lease.
--
-- Below max_attempts the task returns to ready with score now + delay (Redis clock;
-- the delay is at least 1 ms, never immediate). At max_attempts it goes to dead
-- (score = time of death). Either way the error summary is kept in field "e" and the
-- payload stays.
--
-- KEYS[1]  ready ZSET
-- KEYS[2]  active ZSET
-- KEYS[3]  dead ZSET
-- KEYS[4]  task hash key prefix
-- KEYS[5]  priority index ZSET: a task with a priority goes back into it
-- KEYS[6]  controls HASH (its field y flags the index: lib.lua prio_add)
-- KEYS[7]  concurrency-key prefix: a run that held a slot of its key gives it back
--          (lib.lua key_free)
-- ARGV[1]  wake channel
-- ARGV[2]  task id (1..200 bytes)
-- ARGV[3]  lease token (1..100 bytes)
-- ARGV[4]  delay in milliseconds (1..2^40)
-- ARGV[5]  last error (0..4096 bytes)
--
-- Returns 1 back to ready, 2 dead, 0 lease lost (nothing changed).
-- PUBLISHes on the wake channel when the task became the earliest in ready.
-- Malformed ARGV: an error reply, nothing written.

if #ARGV ~= 5 then return fail('expected 5 arguments, got ' .. #ARGV) end
if ARGV[1] == '' then return fail('empty wake channel') end
local id, token, msg = ARGV[2], ARGV[3], ARGV[5]
if #id == 0 or #id > 200 then return fail('id must have 1..200 bytes') end
if #token == 0 or #token > 100 then return fail('token must have 1..100 bytes') end
local delay = int(ARGV[4], 1, 1099511627776)
if delay == nil then return fail('delay must be an integer number of ms in 1..2^40') end
if #msg > 4096 then return fail('last error longer than 4096 bytes') end

local h = KEYS[4] .. id
local f = redis.call('HMGET', h, 's', 't', 'a', 'm', 'y', 'k', 'q')
if f[1] ~= 'a' or f[2] ~= token then return 0 end
if f[7] and key_free(KEYS[7], KEYS[1], KEYS[5], KEYS[6], KEYS[4], h, f[6], f[7]) > 0 then
  redis.call('PUBLISH', ARGV[1], '0')
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREM', KEYS[2], id)
redis.call('HDEL', h, 't')
if (tonumber(f[3]) or 0) >= (tonumber(f[4]) or 25) then -- absent m: 25 (Keys.TaskKey)
  redis.call('HSET', h, 's', 'x', 'e', msg)
  redis.call('ZADD', KEYS[3], fmt(now), id)
  return 2
end

local score = now + delay
local hd = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
redis.call('HSET', h, 's', 'r', 'e', msg)
redis.call('ZADD', KEYS[1], fmt(score), id)
prio_add(KEYS[5], KEYS[6], id, f[5], score)
if hd[2] == nil or score < math.floor(tonumber(hd[2]) * 1000 + 0.5) then
  redis.call('PUBLISH', ARGV[1], fmt(score))
end
return 1
