-- Pushes the expiry back only while the value is still ours: 1 if extended, 0 if not.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
