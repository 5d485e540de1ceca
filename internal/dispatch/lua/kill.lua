-- kill: move an active task to dead at once, only if the token still holds the lease.
--
-- The payload stays (requeue_dead can run it again); the error summary is kept in "e".
--
-- KEYS[1]  active ZSET
-- KEYS[2]  dead ZSET
-- KEYS[3]  task hash key prefix
-- KEYS[4]  ready ZSET, KEYS[5] priority index ZSET, KEYS[6] controls HASH,
-- KEYS[7]  concurrency-key prefix: a run that held a slot of its key gives it back
--          and one parked task of the key returns to ready (lib.lua key_free)
-- ARGV[1]  task id (1..200 bytes)
-- ARGV[2]  lease token (1..100 bytes)
-- ARGV[3]  last error (0..4096 bytes)
-- ARGV[4]  wake channel: published on when a parked task returned to ready
--
-- Returns 1 dead, 0 lease lost (nothing changed).
-- Malformed ARGV: an error reply, nothing written.

if #ARGV ~= 4 then return fail('expected 4 arguments, got ' .. #ARGV) end
if ARGV[4] == '' then return fail('empty wake channel') end
local id, token, msg = ARGV[1], ARGV[2], ARGV[3]
if #id == 0 or #id > 200 then return fail('id must have 1..200 bytes') end
if #token == 0 or #token > 100 then return fail('token must have 1..100 bytes') end
if #msg > 4096 then return fail('last error longer than 4096 bytes') end

local h = KEYS[3] .. id
local f = redis.call('HMGET', h, 's', 't', 'k', 'q')
if f[1] ~= 'a' or f[2] ~= token then return 0 end
if f[4] and key_free(KEYS[7], KEYS[4], KEYS[5], KEYS[6], KEYS[3], h, f[3], f[4]) > 0 then
  redis.call('PUBLISH', ARGV[4], '0')
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREM', KEYS[1], id)
redis.call('HDEL', h, 't')
redis.call('HSET', h, 's', 'x', 'e', msg)
redis.call('ZADD', KEYS[2], fmt(now), id)
return 1
