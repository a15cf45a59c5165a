-- Deletes the key only while the value is still ours: 1 if deleted, 0 if not.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
