-- release: hand a lease back without using up the attempt (worker shutdown).
--
-- Only if the token still holds the lease: the task returns to ready, due now (Redis
-- clock), with attempt - 1 (never below 0), so the interrupted run is not counted.
--
-- KEYS[1]  ready ZSET
-- KEYS[2]  active ZSET
-- KEYS[3]  task hash key prefix
-- ARGV[1]  wake channel
-- ARGV[2]  task id (1..200 bytes)
-- ARGV[3]  lease token (1..100 bytes)
--
-- Returns 1 released, 0 lease lost (nothing changed).
-- PUBLISHes on the wake channel when the task became the earliest in ready.
-- Malformed ARGV: an error reply, nothing written.

if #ARGV ~= 3 then return fail('expected 3 arguments, got ' .. #ARGV) end
if ARGV[1] == '' then return fail('empty wake channel') end
local id, token = ARGV[2], ARGV[3]
if #id == 0 or #id > 200 then return fail('id must have 1..200 bytes') end
if #token == 0 or #token > 100 then return fail('token must have 1..100 bytes') end

local h = KEYS[3] .. id
local f = redis.call('HMGET', h, 's', 't', 'a')
if f[1] ~= 'a' or f[2] ~= token then return 0 end

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
redis.call('ZADD', KEYS[1], fmt(now), id)
if hd[2] == nil or now < math.floor(tonumber(hd[2]) * 1000 + 0.5) then
  redis.call('PUBLISH', ARGV[1], fmt(now))
end
return 1
