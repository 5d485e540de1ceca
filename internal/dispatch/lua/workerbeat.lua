-- workerbeat: a worker process's heartbeat in the process registry (Client.BeatWorker).
--
-- The registry is one HASH per process, which expires unless beaten again, and an
-- index of the processes (ZSET) for listing them (workers.lua):
--
-- KEYS[1]  the index ZSET: member = process id, score = its last beat (Unix seconds,
--          3 decimals, Redis clock)
-- KEYS[2]  the prefix of the process HASH keys (the process id completes it); the
--          HASH holds r the record (JSON, written by the worker), s when the process
--          first beat, b its last beat (both Unix ms, Redis clock)
-- ARGV[1]  process id (1..64 bytes)
-- ARGV[2]  record (1..65536 bytes)
-- ARGV[3]  ttl in milliseconds (1..2^40): how long the hash outlives this beat
--
-- Returns the beat's time in Unix ms. The hash's s is kept from the first beat. The
-- beat also drops from the index up to 10 of its oldest members whose hash has
-- expired (a process gone without a goodbye), and keeps the index at least a day,
-- or ttl if longer: the index lives while any process beats, and not forever after.
-- Malformed ARGV: an error reply, nothing written.

if #ARGV ~= 3 then return fail('expected id, record, ttl; got ' .. #ARGV .. ' arguments') end
local id, rec = ARGV[1], ARGV[2]
if #id == 0 or #id > 64 then return fail('id must have 1..64 bytes') end
if #rec == 0 or #rec > 65536 then return fail('record must have 1..65536 bytes') end
local ttl = int(ARGV[3], 1, 1099511627776)
if ttl == nil then return fail('ttl must be an integer number of ms in 1..2^40') end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local key = KEYS[2] .. id
local started = redis.call('HMGET', key, 's')[1]
local now_s = string.format('%.0f', now)
if not started then started = now_s end
redis.call('HSET', key, 'r', rec, 's', started, 'b', now_s)
redis.call('PEXPIRE', key, ttl)
redis.call('ZADD', KEYS[1], fmt(now), id)

local oldest = redis.call('ZRANGE', KEYS[1], 0, 9)
for _, other in ipairs(oldest) do
  if redis.call('HMGET', KEYS[2] .. other, 'b')[1] == false then
    redis.call('ZREM', KEYS[1], other)
  end
end
local keep = 86400000
if ttl > keep then keep = ttl end
redis.call('PEXPIRE', KEYS[1], keep)
return now
