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
-- Returns 2 when released now and the fence is still this lease's (no Set,
-- Invalidate or newer lease since it was issued), 1 when released otherwise
-- (or by an earlier try), 0 when not ours.
--
-- A failure message of a lease whose fence moved on is sent as 'R' instead,
-- with no failure marker: the load began before a write, so its failure (or
-- its "not found") says nothing about the key as it is now; the followers
-- look again and one of them loads.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  local fence = string.sub(ARGV[1], (string.find(ARGV[1], ':', 1, true) or 0) + 1)
  local current = redis.call('HGET', KEYS[2], 'n') == fence
  local msg = ARGV[4]
  if not current and string.sub(msg, 1, 1) == 'F' then
    msg = 'R'
  end
  if redis.call('EXISTS', KEYS[2]) == 1 then
    redis.call('HSET', KEYS[2], 'r', ARGV[1])
    if KEYS[3] and tonumber(ARGV[5]) > 0 then
      -- The step doubles with each consecutive failure, up to the cap.
      local e = redis.call('HINCRBY', KEYS[2], 'e', 1)
      local step = math.min(tonumber(ARGV[5]) * 2 ^ math.min(e - 1, 30), tonumber(ARGV[6]))
      redis.call('SET', KEYS[3], string.format('%d', e), 'PX', string.format('%d', math.floor(step)))
    end
  end
  if KEYS[4] and tonumber(ARGV[7]) > 0 and msg == ARGV[4] then
    redis.call('SET', KEYS[4], fence .. '|' .. msg, 'PX', ARGV[7])
  end
  redis.call(ARGV[2], ARGV[3], msg)
  if current then
    return 2
  end
  return 1
end
if redis.call('HGET', KEYS[2], 'r') == ARGV[1] then
  return 1
end
return 0
