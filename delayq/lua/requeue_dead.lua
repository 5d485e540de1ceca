-- requeue_dead: give a dead task a new life, due now, with its attempts reset to 0.
--
-- KEYS[1]  ready ZSET
-- KEYS[2]  dead ZSET
-- KEYS[3]  task hash key prefix
-- ARGV[1]  wake channel
-- ARGV[2]  task id (1..200 bytes)
--
-- Returns 1 requeued, 0 not dead (nothing changed). The last error is kept until the
-- task finishes. PUBLISHes on the wake channel when the task became the earliest.
-- Malformed ARGV: an error reply, nothing written.

if #ARGV ~= 2 then return fail('expected 2 arguments, got ' .. #ARGV) end
if ARGV[1] == '' then return fail('empty wake channel') end
local id = ARGV[2]
if #id == 0 or #id > 200 then return fail('id must have 1..200 bytes') end

local h = KEYS[3] .. id
if redis.call('HGET', h, 's') ~= 'x' then return 0 end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local hd = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
redis.call('ZREM', KEYS[2], id)
redis.call('HSET', h, 's', 'r')
redis.call('HDEL', h, 'a')
redis.call('ZADD', KEYS[1], fmt(now), id)
if hd[2] == nil or now < math.floor(tonumber(hd[2]) * 1000 + 0.5) then
  redis.call('PUBLISH', ARGV[1], fmt(now))
end
return 1
