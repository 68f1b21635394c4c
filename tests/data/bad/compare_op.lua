-- comparing tensors with < (comparisons are methods that make masks)
local x = input("x", {4, 8})
local y = input("y", {4, 8})
if x < y then -- ERROR
  minimize(x:sum())
end
