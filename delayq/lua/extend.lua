-- extend: renew the lease of an active task, only if the token still holds it.
--
-- KEYS[1]  active ZSET
-- KEYS[2]  task hash key prefix
-- ARGV[1]  task id (1..200 bytes)
-- ARGV[2]  lease token (1..100 bytes)
-- ARGV[3]  lease in milliseconds from now, Redis clock (1..2^40)
--
-- Returns the new lease deadline (Unix seconds with 3 decimals, a string), or the
-- integer 0 when the lease is lost (task gone, not active, or another token): then
-- nothing changed. Malformed ARGV: an error reply, nothing written.

if #ARGV ~= 3 then return fail('expected 3 arguments, got ' .. #ARGV) end
local id, token = ARGV[1], ARGV[2]
if #id == 0 or #id > 200 then return fail('id must have 1..200 bytes') end
if #token == 0 or #token > 100 then return fail('token must have 1..100 bytes') end
local lease = int(ARGV[3], 1, 1099511627776)
if lease == nil then return fail('lease must be an integer number of ms in 1..2^40') end

local f = redis.call('HMGET', KEYS[2] .. id, 's', 't')
if f[1] ~= 'a' or f[2] ~= token or redis.call('ZSCORE', KEYS[1], id) == false then return 0 end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local until_s = fmt(now + lease)
redis.call('ZADD', KEYS[1], 'XX', until_s, id)
return until_s
