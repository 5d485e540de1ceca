-- remove: delete a task whatever its state (cancel, reconcile). A holder of its lease
-- gets "lease lost" afterwards; its dedupe record is gone too.
--
-- KEYS[1]  ready ZSET
-- KEYS[2]  active ZSET
-- KEYS[3]  dead ZSET
-- KEYS[4]  task hash key prefix
-- KEYS[5]  priority index ZSET (a ready task with a priority is in it too)
-- KEYS[6]  controls HASH, KEYS[7] concurrency-key prefix: a removed run gives
--          its key's slot back; a removed task of a key lets one parked task of
--          the key back into ready (it may have been the one readmitted)
-- ARGV[1]  task id (1..200 bytes)
--
-- Returns 1 if anything was removed, 0 if nothing existed.
-- Malformed ARGV: an error reply, nothing written.

if #ARGV ~= 1 then return fail('expected 1 argument, got ' .. #ARGV) end
local id = ARGV[1]
if #id == 0 or #id > 200 then return fail('id must have 1..200 bytes') end

local h = KEYS[4] .. id
local f = redis.call('HMGET', h, 'k', 'q')
local n = redis.call('ZREM', KEYS[1], id) + redis.call('ZREM', KEYS[2], id)
  + redis.call('ZREM', KEYS[3], id) + redis.call('DEL', KEYS[4] .. id)
redis.call('ZREM', KEYS[5], id)
-- After the removal from ready, so that a removed head (fair dispatch) is gone
-- when its key's next task is readmitted.
if f[1] then
  key_unpark(KEYS[7], f[1], id)
  if f[2] then
    key_free(KEYS[7], KEYS[1], KEYS[5], KEYS[6], KEYS[4], h, f[1], f[2])
  else
    if key_head(KEYS[7], f[1]) == id then redis.call('HDEL', KEYS[7] .. 'h', f[1]) end
    key_admit(KEYS[7], KEYS[1], KEYS[5], KEYS[6], KEYS[4], f[1], 1)
  end
end
if n > 0 then return 1 end
return 0
