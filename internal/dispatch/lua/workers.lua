-- workers: list the process registry (Client.Workers; see workerbeat.lua for the
-- keys). Reads only.
--
-- KEYS[1]  the index ZSET
-- KEYS[2]  the prefix of the process HASH keys (the process id completes it)
-- ARGV[1]  the most processes to return (1..10000), the latest beats first
--
-- Returns { now, id_1, record_1, started_1, beat_1, ... }: now is the Redis clock in
-- Unix ms; record is the process's JSON as it wrote it, started and beat in Unix ms.
-- A member of the index whose hash has expired is left out.
-- Malformed ARGV: an error reply.

if #ARGV ~= 1 then return fail('expected a limit; got ' .. #ARGV .. ' arguments') end
local limit = int(ARGV[1], 1, 10000)
if limit == nil then return fail('limit must be an integer in 1..10000') end

local t = redis.call('TIME')
local out = { tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) }
for _, id in ipairs(redis.call('ZRANGE', KEYS[1], 0, limit - 1, 'REV')) do
  local f = redis.call('HMGET', KEYS[2] .. id, 'r', 's', 'b')
  if f[1] then
    out[#out + 1] = id
    out[#out + 1] = f[1]
    out[#out + 1] = tonumber(f[2]) or 0
    out[#out + 1] = tonumber(f[3]) or 0
  end
end
return out
