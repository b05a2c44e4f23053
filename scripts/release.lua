-- RELEASE: delete the lease only if it is still this owner's, remember that
-- it was released (so a retried release is recognised) and wake the waiters.
-- After a failed refresh it also starts (or lengthens) the key's refresh
-- backoff, so the source is not retried by every process on every hit.
-- After a failed load it also leaves a short-lived failure marker, so that
-- followers that missed the message learn of the failure when they look.
-- KEYS[1] lease, KEYS[2] fence hash, optional KEYS[3] refresh backoff and
-- KEYS[4] failure marker
-- ARGV[1] lease value ("<owner>:<fence>"), ARGV[2] PUBLISH or SPUBLISH,
-- ARGV[3] channel, ARGV[4] message,
-- optional ARGV[5] backoff base ms (0: none), ARGV[6] backoff cap ms and
-- ARGV[7] failure marker ms (0: none)
-- Returns 1 when released (now or by an earlier try), 0 when not ours.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  if redis.call('EXISTS', KEYS[2]) == 1 then
    redis.call('HSET', KEYS[2], 'r', ARGV[1])
    if KEYS[3] and tonumber(ARGV[5]) > 0 then
      -- The step doubles with each consecutive failure, up to the cap.
      local e = redis.call('HINCRBY', KEYS[2], 'e', 1)
      local step = math.min(tonumber(ARGV[5]) * 2 ^ math.min(e - 1, 30), tonumber(ARGV[6]))
      redis.call('SET', KEYS[3], string.format('%d', e), 'PX', string.format('%d', math.floor(step)))
    end
  end
  if KEYS[4] and tonumber(ARGV[7]) > 0 then
    local fence = string.sub(ARGV[1], (string.find(ARGV[1], ':', 1, true) or 0) + 1)
    redis.call('SET', KEYS[4], fence .. '|' .. ARGV[4], 'PX', ARGV[7])
  end
  redis.call(ARGV[2], ARGV[3], ARGV[4])
  return 1
end
if redis.call('HGET', KEYS[2], 'r') == ARGV[1] then
  return 1
end
return 0
