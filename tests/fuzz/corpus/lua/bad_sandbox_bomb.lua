-- a table bomb stops at the Lua memory limit
local x = input("x", {4, 8})
local t, i = {}, 0
while true do
  i = i + 1
  t[i] = {i, i, i, i} -- ERROR
end
minimize(x:sum())
