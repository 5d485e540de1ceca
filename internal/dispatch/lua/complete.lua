-- complete: finish active tasks, each only if its token still holds its lease.
--
-- One call completes one task or a batch of them (a worker acknowledges every run that
-- finished meanwhile in one call). Each task leaves active. With a retention, its hash
-- stays as the dedupe record: only the status "d" and the version "v" are kept (so a
-- later, rescheduled version is told from a repeat), TTL = retention. With retention 0
-- the hash is deleted.
--
-- KEYS[1]  active ZSET
-- KEYS[2]  task hash key prefix
-- KEYS[3]  the queue's history hash prefix (Keys.History): field "d" of the current
--          minute's hash counts the tasks done (lib.lua hist_add)
-- KEYS[4]  ready ZSET, KEYS[5] priority index ZSET, KEYS[6] controls HASH,
-- KEYS[7]  concurrency-key prefix: a run that held a slot of its key gives it back
--          and one parked task of the key returns to ready (lib.lua key_free)
-- ARGV[1]  done retention in milliseconds (0 = delete the hash; at most 2^40)
-- ARGV[2]  wake channel: published on when a parked task returned to ready
-- ARGV[2k+1], ARGV[2k+2]  for k = 1..n (n in 1..1000): task id (1..200 bytes), lease
--                       token (1..100 bytes)
--
-- Returns one code per task, in order: 1 done, 0 lease lost (that task unchanged).
-- Malformed ARGV: an error reply, nothing written.

local n = (#ARGV - 2) / 2
if n < 1 or n > 1000 or n ~= math.floor(n) then
  return fail('expected a retention, a wake channel and 1..1000 id, token pairs, got ' .. #ARGV .. ' arguments')
end
if ARGV[2] == '' then return fail('empty wake channel') end
local retention = int(ARGV[1], 0, 1099511627776)
if retention == nil then return fail('retention must be an integer number of ms in 0..2^40') end
-- Validate everything before the first write.
for i = 3, #ARGV, 2 do
  if #ARGV[i] == 0 or #ARGV[i] > 200 then return fail('id must have 1..200 bytes') end
  if #ARGV[i + 1] == 0 or #ARGV[i + 1] > 100 then return fail('token must have 1..100 bytes') end
end

local out = {}
local finished = {}
local back = 0
for i = 3, #ARGV, 2 do
  local id = ARGV[i]
  local h = KEYS[2] .. id
  local f = redis.call('HMGET', h, 's', 't', 'k', 'q')
  if f[1] ~= 'a' or f[2] ~= ARGV[i + 1] then
    out[#out + 1] = 0
  else
    finished[#finished + 1] = id
    if f[4] then back = back + key_free(KEYS[7], KEYS[4], KEYS[5], KEYS[6], KEYS[2], h, f[3], f[4]) end
    if retention == 0 then
      redis.call('DEL', h)
    else
      redis.call('HSET', h, 's', 'd')
      redis.call('HDEL', h, 'p', 't', 'e', 'm', 'a', 'k')
      redis.call('PEXPIRE', h, retention)
    end
    out[#out + 1] = 1
  end
end
-- One ZREM for the batch, and one count in the history.
if #finished > 0 then
  redis.call('ZREM', KEYS[1], unpack(finished))
  local t = redis.call('TIME')
  hist_add(KEYS[3], tonumber(t[1]) * 1000, { d = #finished })
end
if back > 0 then redis.call('PUBLISH', ARGV[2], '0') end
return out
