return function(name, shape)
  local d = name:match("^fc(%d)%.")
  if d then return (name:gsub("^fc%d", "body." .. (d - 1))) end
end
