-- REDLOCK EXTEND (on one master): renew the lease only if it is still this
-- owner's here, and keep the fence counter alive. It never shortens the
-- lease: the expiry moves only to a later time (PTTL below the new ttl),
-- so an extend that fails, or whose request lands late, can never cut a
-- lease short under a holder that still counts on the old deadline.
-- KEYS[1] lease, KEYS[2] fence hash
-- ARGV[1] owner, ARGV[2] lease ms, ARGV[3] fence ttl ms
-- Returns 1 when the lease is this owner's here and now lasts at least
-- ARGV[2] ms, 0 when the lease is not this owner's here.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local p = redis.call('PTTL', KEYS[1])
if p >= 0 and p < tonumber(ARGV[2]) then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
if redis.call('PTTL', KEYS[2]) < tonumber(ARGV[3]) then
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
end
return 1
