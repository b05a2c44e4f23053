-- FENCE: raise the record's fence to the writer's token without changing
-- its value, and return that value, in one step: a claim that no write of
-- an older token can land between (a read, then a rewrite, could lose
-- such a write). Tokens compare as in fencedset.lua.
-- KEYS[1] record hash (t = highest token, v = value)
-- ARGV[1] token
-- Returns {1, value} when raised (a missing record is created with an
-- empty value and no expiry), {0, highest} when fenced.
local top = redis.call('HGET', KEYS[1], 't')
if top then
  local tok = ARGV[1]
  if #top > #tok or (#top == #tok and top > tok) then
    return {0, top}
  end
end
local v = redis.call('HGET', KEYS[1], 'v') or ''
redis.call('HSET', KEYS[1], 't', ARGV[1], 'v', v)
return {1, v}
