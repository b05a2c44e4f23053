-- REDLOCK EXTEND (on one master): renew the lease only if it is still this
-- owner's here, and keep the fence counter alive.
-- KEYS[1] lease, KEYS[2] fence hash
-- ARGV[1] owner, ARGV[2] lease ms, ARGV[3] fence ttl ms
-- Returns 1 when renewed, 0 when the lease is not this owner's here.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
if redis.call('PTTL', KEYS[2]) < tonumber(ARGV[3]) then
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
end
return 1
