-- stats: queue counts on the Redis clock. Reads only.
--
-- KEYS[1]  ready ZSET
-- KEYS[2]  active ZSET
-- KEYS[3]  dead ZSET
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
return {
  redis.call('ZCARD', KEYS[1]),
  redis.call('ZCOUNT', KEYS[1], '-inf', now),
  redis.call('ZCARD', KEYS[2]),
  redis.call('ZCOUNT', KEYS[2], '-inf', '(' .. now),
  redis.call('ZCARD', KEYS[3]),
  now,
  head,
}
