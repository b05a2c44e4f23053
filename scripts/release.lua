-- RELEASE: delete the lease only if it is still this owner's, remember that
-- it was released (so a retried release is recognised) and wake the waiters.
-- KEYS[1] lease, KEYS[2] fence hash
-- ARGV[1] lease value ("<owner>:<fence>"), ARGV[2] PUBLISH or SPUBLISH,
-- ARGV[3] channel, ARGV[4] message
-- Returns 1 when released (now or by an earlier try), 0 when not ours.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  if redis.call('EXISTS', KEYS[2]) == 1 then
    redis.call('HSET', KEYS[2], 'r', ARGV[1])
  end
  redis.call(ARGV[2], ARGV[3], ARGV[4])
  return 1
end
if redis.call('HGET', KEYS[2], 'r') == ARGV[1] then
  return 1
end
return 0
