-- train{batch=...} that disagrees with the inputs' leading dimension
local x = input("x", {4, 8})
minimize(x:sum())
train{batch = 8} -- ERROR
