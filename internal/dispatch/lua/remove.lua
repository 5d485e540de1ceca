-- remove: delete a task whatever its state (cancel, reconcile). A holder of its lease
-- gets "lease lost" afterwards; its dedupe record is gone too.
--
-- KEYS[1]  ready ZSET
-- KEYS[2]  active ZSET
-- KEYS[3]  dead ZSET
-- KEYS[4]  task hash key prefix
-- KEYS[5]  priority index ZSET (a ready task with a priority is in it too)
-- ARGV[1]  task id (1..200 bytes)
--
-- Returns 1 if anything was removed, 0 if nothing existed.
-- Malformed ARGV: an error reply, nothing written.

if #ARGV ~= 1 then return fail('expected 1 argument, got ' .. #ARGV) end
local id = ARGV[1]
if #id == 0 or #id > 200 then return fail('id must have 1..200 bytes') end

local n = redis.call('ZREM', KEYS[1], id) + redis.call('ZREM', KEYS[2], id)
  + redis.call('ZREM', KEYS[3], id) + redis.call('DEL', KEYS[4] .. id)
redis.call('ZREM', KEYS[5], id)
if n > 0 then return 1 end
return 0
