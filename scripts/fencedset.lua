-- FENCED SET: write only when the writer's token is at least the highest
-- token this record has seen. Tokens are decimal strings without leading
-- zeros, compared by length and then bytes, so the check is exact for any
-- uint64 (Lua numbers would lose precision above 2^53).
-- KEYS[1] record hash (t = highest token, v = value)
-- ARGV[1] token, ARGV[2] value, ARGV[3] ttl ms (0 = no expiry)
-- Returns {1, token} when written, {0, highest} when fenced.
local top = redis.call('HGET', KEYS[1], 't')
if top then
  local tok = ARGV[1]
  if #top > #tok or (#top == #tok and top > tok) then
    return {0, top}
  end
end
redis.call('HSET', KEYS[1], 't', ARGV[1], 'v', ARGV[2])
if ARGV[3] == '0' then
  redis.call('PERSIST', KEYS[1])
else
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
end
return {1, ARGV[1]}
