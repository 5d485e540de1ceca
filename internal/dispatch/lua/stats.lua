-- stats: queue counts on the Redis clock. Reads only.
--
-- KEYS[1]  ready ZSET
-- KEYS[2]  active ZSET
-- KEYS[3]  dead ZSET
-- KEYS[4]  concurrency-key prefix (optional): the tasks parked for their keys
--          (lib.lua, a count kept by the scripts) are ready too
-- (no ARGV)
--
-- Returns { ready, due_now, active, expired_leases, dead, now, head }
--   now   Unix seconds with 3 decimals (string)
--   head  earliest score in ready (string), or "" when ready is empty
-- Any ARGV: an error reply.

if #ARGV ~= 0 then return fail('expected no arguments, got ' .. #ARGV) end

local t = redis.call('TIME')
local now = fmt(tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
local h = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local head = ''
if h[2] then head = fmt(math.floor(tonumber(h[2]) * 1000 + 0.5)) end
local parked = 0
if KEYS[4] then parked = math.max(tonumber(redis.call('GET', KEYS[4] .. 'n')) or 0, 0) end
return {
  redis.call('ZCARD', KEYS[1]) + parked,
  redis.call('ZCOUNT', KEYS[1], '-inf', now),
  redis.call('ZCARD', KEYS[2]),
  redis.call('ZCOUNT', KEYS[2], '-inf', '(' .. now),
  redis.call('ZCARD', KEYS[3]),
  now,
  head,
}
