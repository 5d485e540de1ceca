-- complete: finish an active task, only if the token still holds its lease.
--
-- The task leaves active. With a retention, its hash stays as the dedupe record:
-- only the status "d" and the version "v" are kept (so a later, rescheduled version
-- is told from a repeat), TTL = retention.
-- With retention 0 the hash is deleted.
--
-- KEYS[1]  active ZSET
-- KEYS[2]  task hash key prefix
-- ARGV[1]  task id (1..200 bytes)
-- ARGV[2]  lease token (1..100 bytes)
-- ARGV[3]  done retention in milliseconds (0 = delete the hash; at most 2^40)
--
-- Returns 1 done, 0 lease lost (nothing changed).
-- Malformed ARGV: an error reply, nothing written.

local function fail(msg) return redis.error_reply('ERR delayq complete: ' .. msg) end

local function int(s, min, max)
  if type(s) ~= 'string' or not string.match(s, '^%d+$') then return nil end
  local n = tonumber(s)
  if n < min or n > max then return nil end
  return n
end

if #ARGV ~= 3 then return fail('expected 3 arguments, got ' .. #ARGV) end
local id, token = ARGV[1], ARGV[2]
if #id == 0 or #id > 200 then return fail('id must have 1..200 bytes') end
if #token == 0 or #token > 100 then return fail('token must have 1..100 bytes') end
local retention = int(ARGV[3], 0, 1099511627776)
if retention == nil then return fail('retention must be an integer number of ms in 0..2^40') end

local h = KEYS[2] .. id
local f = redis.call('HMGET', h, 's', 't')
if f[1] ~= 'a' or f[2] ~= token then return 0 end

redis.call('ZREM', KEYS[1], id)
if retention == 0 then
  redis.call('DEL', h)
else
  redis.call('HSET', h, 's', 'd')
  redis.call('HDEL', h, 'p', 't', 'e', 'm', 'a')
  redis.call('PEXPIRE', h, retention)
end
return 1
