-- FENCED SET: write only when the writer's token is at least the highest
-- token this record has seen. Tokens are decimal strings without leading
-- zeros, compared by length and then bytes, so the check is exact for any
-- uint64 (Lua numbers would lose precision above 2^53).
-- With ARGV[4] = '1' it is FENCE (FencedStore.Fence): the fence is raised
-- and the value kept, and returned, in one step, a claim that no write of
-- an older token can land between (a read, then a rewrite, could lose
-- such a write); the record keeps its expiry, and a missing one is
-- created with an empty value and none.
-- KEYS[1] record hash (t = highest token, v = value)
-- ARGV[1] token, ARGV[2] value, ARGV[3] ttl ms (0 = no expiry), ARGV[4]
-- '1' for FENCE (ARGV[2] and ARGV[3] unused)
-- Returns {1, token} when written ({1, value} for FENCE), {0, highest}
-- when fenced.
local top = redis.call('HGET', KEYS[1], 't')
if top then
  local tok = ARGV[1]
  if #top > #tok or (#top == #tok and top > tok) then
    return {0, top}
  end
end
if ARGV[4] == '1' then
  local v = redis.call('HGET', KEYS[1], 'v') or ''
  redis.call('HSET', KEYS[1], 't', ARGV[1], 'v', v)
  return {1, v}
end
redis.call('HSET', KEYS[1], 't', ARGV[1], 'v', ARGV[2])
if ARGV[3] == '0' then
  redis.call('PERSIST', KEYS[1])
else
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
end
return {1, ARGV[1]}
