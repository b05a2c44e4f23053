-- REDLOCK RAISE (round 2, on one master): raise the node's fence counter to
-- at least the chosen token, only while this owner still holds the lease
-- here. Idempotent, so a retried raise is harmless.
-- KEYS[1] lease, KEYS[2] fence hash
-- ARGV[1] owner, ARGV[2] token (decimal), ARGV[3] fence ttl ms
-- Returns 1 when the counter is now at least the token, 0 when another
-- owner holds the lease here, -1 when nobody does (it expired, or the
-- master restarted empty).
local cur = redis.call('GET', KEYS[1])
if cur ~= ARGV[1] then
  if cur then
    return 0
  end
  return -1
end
local n = redis.call('HGET', KEYS[2], 'n')
if not n or tonumber(n) < tonumber(ARGV[2]) then
  redis.call('HSET', KEYS[2], 'n', ARGV[2])
end
if redis.call('PTTL', KEYS[2]) < tonumber(ARGV[3]) then
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
end
return 1
