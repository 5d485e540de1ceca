-- extend: renew the leases of active tasks, each only if its token still holds it.
--
-- One call renews one lease or a batch of them (a worker renews every lease it holds
-- in a queue with one call per heartbeat). All renewed leases get the same deadline.
--
-- KEYS[1]  active ZSET
-- KEYS[2]  task hash key prefix
-- ARGV[1]  lease in milliseconds from now, Redis clock (1..2^40)
-- ARGV[2k], ARGV[2k+1]  for k = 1..n (n in 1..1000): task id (1..200 bytes), lease token
--                       (1..100 bytes)
--
-- Returns { until, code_1, ..., code_n }: until is the new lease deadline (Unix
-- seconds with 3 decimals, a string); code_k is 1 when lease k was renewed, 0 when
-- it is lost (task gone, not active, or another token): that task unchanged.
-- Malformed ARGV: an error reply, nothing written.

local n = (#ARGV - 1) / 2
if n < 1 or n > 1000 or n ~= math.floor(n) then
  return fail('expected a lease and 1..1000 id, token pairs, got ' .. #ARGV .. ' arguments')
end
local lease = int(ARGV[1], 1, 1099511627776)
if lease == nil then return fail('lease must be an integer number of ms in 1..2^40') end
-- Validate everything before the first write.
for i = 2, #ARGV, 2 do
  if #ARGV[i] == 0 or #ARGV[i] > 200 then return fail('id must have 1..200 bytes') end
  if #ARGV[i + 1] == 0 or #ARGV[i + 1] > 100 then return fail('token must have 1..100 bytes') end
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local until_s = fmt(now + lease)

local out = { until_s }
local renewed = {}
for i = 2, #ARGV, 2 do
  local id = ARGV[i]
  local f = redis.call('HMGET', KEYS[2] .. id, 's', 't')
  if f[1] == 'a' and f[2] == ARGV[i + 1] and redis.call('ZSCORE', KEYS[1], id) ~= false then
    renewed[#renewed + 1] = until_s
    renewed[#renewed + 1] = id
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
-- One ZADD for the batch.
if #renewed > 0 then redis.call('ZADD', KEYS[1], 'XX', unpack(renewed)) end
return out
